// RUN: kinac opt %s --passes sum-loops | FileCheck %s

// After bufferization a sum over the innermost (unit-stride) dim becomes, per row,
// a vector of partial sums (256 bytes: 64 f32 lanes) over the row's whole vectors,
// its lanes added pairwise (halves, quarters, ...), that total added to the
// output's initial value, then the remaining elements in order.

#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>

// CHECK-LABEL: func.func @rows(
// CHECK-SAME:    %[[X:[^:]+]]: memref<4x1000xf32, strided<[?, 1], offset: ?>>, %[[S:[^:]+]]: memref<4xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         scf.for %[[R:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:           %[[WHOLE:.+]] = arith.subi %[[N:[^,]+]], %{{.+}} : index
// CHECK-NEXT:      %[[ZERO:.+]] = arith.constant dense<0.000000e+00> : vector<64xf32>
// CHECK:           %[[LANES:.+]] = scf.for %[[J:.+]] = %{{.+}} to %[[WHOLE]] step %{{.+}} iter_args(%[[P:.+]] = %[[ZERO]]) -> (vector<64xf32>) {
// CHECK-NEXT:        %[[V:.+]] = vector.load %[[X]][%[[R]], %[[J]]] : memref<4x1000xf32, strided<[?, 1], offset: ?>>, vector<64xf32>
// CHECK-NEXT:        %[[P1:.+]] = arith.addf %[[P]], %[[V]] : vector<64xf32>
// CHECK-NEXT:        scf.yield %[[P1]] : vector<64xf32>
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[LO32:.+]] = vector.extract_strided_slice %[[LANES]] {offsets = [0], sizes = [32], strides = [1]}
// CHECK-NEXT:      %[[HI32:.+]] = vector.extract_strided_slice %[[LANES]] {offsets = [32], sizes = [32], strides = [1]}
// CHECK-NEXT:      %[[H32:.+]] = arith.addf %[[LO32]], %[[HI32]] : vector<32xf32>
// CHECK-NEXT:      %[[LO16:.+]] = vector.extract_strided_slice %[[H32]] {offsets = [0], sizes = [16], strides = [1]}
// CHECK-NEXT:      %[[HI16:.+]] = vector.extract_strided_slice %[[H32]] {offsets = [16], sizes = [16], strides = [1]}
// CHECK-NEXT:      %[[H16:.+]] = arith.addf %[[LO16]], %[[HI16]] : vector<16xf32>
// CHECK:           %[[H1:.+]] = arith.addf %{{.+}}, %{{.+}} : vector<1xf32>
// CHECK-NEXT:      %[[INIT:.+]] = memref.load %[[S]][%[[R]]] : memref<4xf32>
// CHECK-NEXT:      %[[LANE:.+]] = vector.extract %[[H1]][0] : f32 from vector<1xf32>
// CHECK-NEXT:      %[[T:.+]] = arith.addf %[[INIT]], %[[LANE]] : f32
// CHECK-NEXT:      %[[TOTAL:.+]] = scf.for %[[JT:.+]] = %[[WHOLE]] to %[[N]] step %{{.+}} iter_args(%[[A:.+]] = %[[T]]) -> (f32) {
// CHECK-NEXT:        %[[E:.+]] = memref.load %[[X]][%[[R]], %[[JT]]]
// CHECK-NEXT:        %[[A1:.+]] = arith.addf %[[A]], %[[E]] : f32
// CHECK-NEXT:        scf.yield %[[A1]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      memref.store %[[TOTAL]], %[[S]][%[[R]]] : memref<4xf32>
// CHECK-NEXT:    }
func.func @rows(%x: memref<4x1000xf32, strided<[?, 1], offset: ?>>, %s: memref<4xf32>) {
  linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<4x1000xf32, strided<[?, 1], offset: ?>>) outs(%s : memref<4xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %t = arith.addf %v, %acc : f32
    linalg.yield %t : f32
  }
  return
}

// A symbolic length, f64 (32 lanes), rank 1 into a rank-0 output, the body's add
// written the other way round.
// CHECK-LABEL: func.func @symbolic(
// CHECK-SAME:    %[[X:[^:]+]]: memref<?xf64>, %[[S:[^:]+]]: memref<f64>)
// CHECK:         %[[N:.+]] = memref.dim %[[X]], %{{.+}} : memref<?xf64>
// CHECK:         %[[WHOLE:.+]] = arith.subi %[[N]], %{{.+}} : index
// CHECK:         scf.for %{{.+}} = %{{.+}} to %[[WHOLE]] step %{{.+}} iter_args(%{{.+}}) -> (vector<32xf64>) {
// CHECK:         %[[INIT:.+]] = memref.load %[[S]][] : memref<f64>
// CHECK:         %[[TOTAL:.+]] = scf.for %{{.+}} = %[[WHOLE]] to %[[N]] step %{{.+}} iter_args(%{{.+}}) -> (f64) {
// CHECK:         memref.store %[[TOTAL]], %[[S]][] : memref<f64>
func.func @symbolic(%x: memref<?xf64>, %s: memref<f64>) {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>], iterator_types = ["reduction"]}
      ins(%x : memref<?xf64>) outs(%s : memref<f64>) {
  ^bb0(%v: f64, %acc: f64):
    %t = arith.addf %acc, %v : f64
    linalg.yield %t : f64
  }
  return
}

// Not rewritten: a sum over the outer dim, a max over the inner dim, a sum along
// an inner dim whose stride is not 1, and a sum still on tensors.
// CHECK-LABEL: func.func @untouched(
// CHECK-NOT:     scf.for
// CHECK:         linalg.generic {indexing_maps = [#{{.+}}, #{{.+}}], iterator_types = ["reduction", "parallel"]}
// CHECK:         linalg.generic
// CHECK:           arith.maximumf
// CHECK:         linalg.generic {{.*}} ins(%{{.+}} : memref<4x8xf32, strided<[1, 4]>>)
// CHECK:         linalg.generic {{.*}} ins(%{{.+}} : tensor<4x8xf32>)
// CHECK-NOT:     scf.for
// CHECK:         return
func.func @untouched(%x: memref<4x8xf32>, %cols: memref<8xf32>, %rows: memref<4xf32>,
                     %xt: memref<4x8xf32, strided<[1, 4]>>, %t: tensor<4x8xf32>, %init: tensor<4xf32>) -> tensor<4xf32> {
  linalg.generic {indexing_maps = [affine_map<(j, i) -> (i, j)>, affine_map<(j, i) -> (j)>], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<4x8xf32>) outs(%cols : memref<8xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.addf %v, %acc : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<4x8xf32>) outs(%rows : memref<4xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.maximumf %v, %acc : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%xt : memref<4x8xf32, strided<[1, 4]>>) outs(%rows : memref<4xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.addf %v, %acc : f32
    linalg.yield %r : f32
  }
  %s = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%t : tensor<4x8xf32>) outs(%init : tensor<4xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %r = arith.addf %v, %acc : f32
    linalg.yield %r : f32
  } -> tensor<4xf32>
  return %s : tensor<4xf32>
}
