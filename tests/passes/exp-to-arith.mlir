// RUN: kinac opt %s --passes exp-to-arith | FileCheck %s

// Every f32 math.exp becomes plain arith ops: clamp, k = round(x * log2(e)),
// r = x - k * ln2 in two parts, Cephes' polynomial in r, then 2**k built from
// exponent bits in two halves, with selects for NaN, underflow and overflow.

// CHECK-LABEL: func.func @scalar(
// CHECK-SAME:    %[[X:[^:]+]]: f32) -> f32
// CHECK-NOT:     math.exp
// CHECK:         %[[NAN:.+]] = arith.cmpf uno, %[[X]], %[[X]] : f32
// CHECK:         %[[LO:.+]] = arith.constant -1.040000e+02 : f32
// CHECK-NEXT:    %[[MAX:.+]] = arith.maximumf %[[X]], %[[LO]] : f32
// CHECK-NEXT:    %[[HI:.+]] = arith.constant 88.7228394 : f32
// CHECK-NEXT:    %[[CLAMPED:.+]] = arith.minimumf %[[MAX]], %[[HI]] : f32
// CHECK-NEXT:    %[[XS:.+]] = arith.select %[[NAN]], %{{.+}}, %[[CLAMPED]] : f32
// Round to nearest by adding and taking away 1.5 * 2**23:
// CHECK-NEXT:    %[[MAGIC:.+]] = arith.constant 0x4B400000 : f32
// CHECK-NEXT:    %[[LOG2E:.+]] = arith.constant 1.44269502 : f32
// CHECK-NEXT:    %[[T:.+]] = arith.mulf %[[XS]], %[[LOG2E]] : f32
// CHECK-NEXT:    %[[T1:.+]] = arith.addf %[[T]], %[[MAGIC]] : f32
// CHECK-NEXT:    %[[K:.+]] = arith.subf %[[T1]], %[[MAGIC]] : f32
// Cody-Waite: ln2 in two parts.
// CHECK-NEXT:    %[[C1:.+]] = arith.constant -0.693359375 : f32
// CHECK-NEXT:    %[[KC1:.+]] = arith.mulf %[[K]], %[[C1]] : f32
// CHECK-NEXT:    %[[R0:.+]] = arith.addf %[[XS]], %[[KC1]] : f32
// CHECK-NEXT:    %[[C2:.+]] = arith.constant 2.12194442E-4 : f32
// CHECK-NEXT:    %[[KC2:.+]] = arith.mulf %[[K]], %[[C2]] : f32
// CHECK-NEXT:    %[[R:.+]] = arith.addf %[[R0]], %[[KC2]] : f32
// The polynomial, by Horner's rule in r:
// CHECK-NEXT:    %[[P0:.+]] = arith.constant 1.98756912E-4 : f32
// CHECK-NEXT:    %[[Y0:.+]] = arith.mulf %[[P0]], %[[R]] : f32
// CHECK-COUNT-4: arith.mulf %{{.+}}, %[[R]] : f32
// CHECK:         %[[R2:.+]] = arith.mulf %[[R]], %[[R]] : f32
// CHECK:         %[[KI:.+]] = arith.fptosi %[[K]] : f32 to i32
// CHECK:         %[[HALF:.+]] = arith.shrsi %[[KI]], %{{.+}} : i32
// CHECK:         arith.bitcast %{{.+}} : i32 to f32
// CHECK:         arith.subi %[[KI]], %[[HALF]] : i32
// CHECK:         arith.bitcast %{{.+}} : i32 to f32
// CHECK:         %[[UNDER:.+]] = arith.cmpf olt, %[[X]], %{{.+}} : f32
// CHECK:         %[[Y1:.+]] = arith.select %[[UNDER]], %{{.+}}, %{{.+}} : f32
// CHECK:         %[[OVER:.+]] = arith.cmpf ogt, %[[X]], %{{.+}} : f32
// CHECK-NEXT:    %[[INF:.+]] = arith.constant 0x7F800000 : f32
// CHECK-NEXT:    %[[Y2:.+]] = arith.select %[[OVER]], %[[INF]], %[[Y1]] : f32
// CHECK-NEXT:    %[[E:.+]] = arith.select %[[NAN]], %[[X]], %[[Y2]] : f32
// CHECK-NEXT:    return %[[E]] : f32
func.func @scalar(%x: f32) -> f32 {
  %e = math.exp %x : f32
  return %e : f32
}

// Inside a linalg body, as softmax has it: the uses of the exp take the new value.
// CHECK-LABEL: func.func @in_softmax(
// CHECK:         linalg.generic
// CHECK-NEXT:    ^bb0(%[[A:[^:]+]]: f32, %[[B:[^:]+]]: f32, %{{.+}}: f32):
// CHECK-NEXT:      %[[D:.+]] = arith.subf %[[A]], %[[B]] : f32
// CHECK-NEXT:      %[[NAN:.+]] = arith.cmpf uno, %[[D]], %[[D]] : f32
// CHECK-NOT:       math.exp
// CHECK:           %[[E:.+]] = arith.select %[[NAN]], %[[D]], %{{.+}} : f32
// CHECK-NEXT:      linalg.yield %[[E]] : f32
func.func @in_softmax(%x: tensor<2x4xf32>, %max: tensor<2xf32>) -> tensor<2x4xf32> {
  %e0 = tensor.empty() : tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %max : tensor<2x4xf32>, tensor<2xf32>) outs(%e0 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %v = math.exp %d : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}

// Not rewritten: exp of f16 and of f64, and other math ops on f32.
// CHECK-LABEL: func.func @untouched(
// CHECK-SAME:    %[[H:[^:]+]]: f16, %[[D:[^:]+]]: f64, %[[X:[^:]+]]: f32)
// CHECK-NEXT:    %[[EH:.+]] = math.exp %[[H]] : f16
// CHECK-NEXT:    %[[ED:.+]] = math.exp %[[D]] : f64
// CHECK-NEXT:    %[[L:.+]] = math.log %[[X]] : f32
// CHECK-NEXT:    return %[[EH]], %[[ED]], %[[L]]
func.func @untouched(%h: f16, %d: f64, %x: f32) -> (f16, f64, f32) {
  %eh = math.exp %h : f16
  %ed = math.exp %d : f64
  %l = math.log %x : f32
  return %eh, %ed, %l : f16, f64, f32
}
