// RUN: kinac opt %s --passes abi | FileCheck %s
// A function that already has the C interface is left alone, so a second run changes nothing:
// RUN: kinac opt %s --passes abi,abi | FileCheck %s
// The prefix is an option (kina.runtime looks for the default, kina_):
// RUN: kinac opt %s --passes 'abi{prefix=my_}' | FileCheck %s --check-prefix=PREFIX
// PREFIX: func.func @my_neg(
// PREFIX-NOT: @kina_

// Each func.func @f(tensors) -> (tensors) becomes @kina_f(memrefs..., out-memrefs...)
// with llvm.emit_c_interface and no results: parameters are read through
// bufferization.to_tensor, and each result is computed in its out-buffer.

#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>

// The tensor.empty a result is built on becomes its out-buffer, so the
// materialize_in_destination at the end is a copy onto itself.
// CHECK-LABEL: func.func @kina_neg(
// CHECK-SAME:    %[[X:[^:]+]]: memref<2x3xf32, strided<[?, 1], offset: ?>>,
// CHECK-SAME:    %[[OUT:[^:]+]]: memref<2x3xf32, strided<[?, 1], offset: ?>>)
// CHECK-SAME:    attributes {llvm.emit_c_interface} {
// CHECK-NEXT:    %[[XT:.+]] = bufferization.to_tensor %[[X]] restrict : memref<2x3xf32, strided<[?, 1], offset: ?>> to tensor<2x3xf32>
// CHECK-NEXT:    %[[OUTT:.+]] = bufferization.to_tensor %[[OUT]] restrict writable : memref<2x3xf32, strided<[?, 1], offset: ?>> to tensor<2x3xf32>
// CHECK-NOT:     tensor.empty
// CHECK:         %[[Y:.+]] = linalg.generic {{.*}} ins(%[[XT]] : tensor<2x3xf32>) outs(%[[OUTT]] : tensor<2x3xf32>)
// CHECK:         bufferization.materialize_in_destination %[[Y]] in restrict writable %[[OUT]]
// CHECK-NEXT:    return{{$}}
// CHECK-NOT:     func.func @neg(
func.func @neg(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %e = tensor.empty() : tensor<2x3xf32>
  %y = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x3xf32>) outs(%e : tensor<2x3xf32>) {
  ^bb0(%a: f32, %o: f32):
    %n = arith.negf %a : f32
    linalg.yield %n : f32
  } -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// The base tensor.empty is found through a concat's insert_slice destinations and
// through the inits of linalg ops (a sum's fill); symbolic sizes stay symbolic.
// CHECK-LABEL: func.func @kina_concat_and_sum(
// CHECK-SAME:    %[[A:[^:]+]]: memref<?x2xf32, strided<[?, 1], offset: ?>>, %[[B:[^:]+]]: memref<?x1xf32, strided<[?, 1], offset: ?>>,
// CHECK-SAME:    %[[OUT0:[^:]+]]: memref<?x3xf32, strided<[?, 1], offset: ?>>, %[[OUT1:[^:]+]]: memref<?xf32, strided<[1], offset: ?>>)
// CHECK-SAME:    attributes {llvm.emit_c_interface}
// CHECK:         %[[AT:.+]] = bufferization.to_tensor %[[A]] restrict :
// CHECK:         %[[BT:.+]] = bufferization.to_tensor %[[B]] restrict :
// CHECK:         %[[C0:.+]] = bufferization.to_tensor %[[OUT0]] restrict writable : memref<?x3xf32, strided<[?, 1], offset: ?>> to tensor<?x3xf32>
// CHECK:         %[[S0:.+]] = bufferization.to_tensor %[[OUT1]] restrict writable : memref<?xf32, strided<[1], offset: ?>> to tensor<?xf32>
// CHECK-NOT:     tensor.empty
// CHECK:         %[[C1:.+]] = tensor.insert_slice %[[AT]] into %[[C0]]
// CHECK:         %[[C:.+]] = tensor.insert_slice %[[BT]] into %[[C1]]
// CHECK:         %[[Z:.+]] = linalg.fill ins(%{{.+}} : f32) outs(%[[S0]] : tensor<?xf32>)
// CHECK:         %[[SUM:.+]] = linalg.generic {{.*}} ins(%[[C]] : tensor<?x3xf32>) outs(%[[Z]] : tensor<?xf32>)
// CHECK:         bufferization.materialize_in_destination %[[C]] in restrict writable %[[OUT0]]
// CHECK-NEXT:    bufferization.materialize_in_destination %[[SUM]] in restrict writable %[[OUT1]]
// CHECK-NEXT:    return{{$}}
func.func @concat_and_sum(%a: tensor<?x2xf32>, %b: tensor<?x1xf32>) -> (tensor<?x3xf32>, tensor<?xf32>) {
  %i0 = arith.constant 0 : index
  %n = tensor.dim %a, %i0 : tensor<?x2xf32>
  %e = tensor.empty(%n) : tensor<?x3xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [%n, 2] [1, 1] : tensor<?x2xf32> into tensor<?x3xf32>
  %c = tensor.insert_slice %b into %c0[0, 2] [%n, 1] [1, 1] : tensor<?x1xf32> into tensor<?x3xf32>
  %zero = arith.constant 0.0 : f32
  %es = tensor.empty(%n) : tensor<?xf32>
  %z = linalg.fill ins(%zero : f32) outs(%es : tensor<?xf32>) -> tensor<?xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%c : tensor<?x3xf32>) outs(%z : tensor<?xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %s = arith.addf %v, %acc : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  return %c, %sum : tensor<?x3xf32>, tensor<?xf32>
}

// A result with no tensor.empty of its own (a parameter returned as it is, here a
// rank-0 one) is copied into its out-buffer, which is not read as a tensor.
// CHECK-LABEL: func.func @kina_identity(
// CHECK-SAME:    %[[S:[^:]+]]: memref<f32, strided<[], offset: ?>>, %[[OUT:[^:]+]]: memref<f32, strided<[], offset: ?>>)
// CHECK-SAME:    attributes {llvm.emit_c_interface}
// CHECK-NEXT:    %[[ST:.+]] = bufferization.to_tensor %[[S]] restrict : memref<f32, strided<[], offset: ?>> to tensor<f32>
// CHECK-NEXT:    bufferization.materialize_in_destination %[[ST]] in restrict writable %[[OUT]]
// CHECK-NEXT:    return{{$}}
func.func @identity(%s: tensor<f32>) -> tensor<f32> {
  return %s : tensor<f32>
}

// The same value returned twice is computed in the first out-buffer and copied
// into the second.
// CHECK-LABEL: func.func @kina_twice(
// CHECK-SAME:    %[[X:[^:]+]]: memref<2x3xf32, {{.*}}>, %[[OUT0:[^:]+]]: memref<2x3xf32, {{.*}}>, %[[OUT1:[^:]+]]: memref<2x3xf32, {{.*}}>)
// CHECK:         %[[XT:.+]] = bufferization.to_tensor %[[X]] restrict :
// CHECK-NEXT:    %[[OUT0T:.+]] = bufferization.to_tensor %[[OUT0]] restrict writable :
// CHECK-NEXT:    %[[Y:.+]] = linalg.generic {{.*}} ins(%[[XT]] : tensor<2x3xf32>) outs(%[[OUT0T]] : tensor<2x3xf32>)
// CHECK:         bufferization.materialize_in_destination %[[Y]] in restrict writable %[[OUT0]]
// CHECK-NEXT:    bufferization.materialize_in_destination %[[Y]] in restrict writable %[[OUT1]]
// CHECK-NEXT:    return{{$}}
func.func @twice(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
  %e = tensor.empty() : tensor<2x3xf32>
  %y = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x3xf32>) outs(%e : tensor<2x3xf32>) {
  ^bb0(%a: f32, %o: f32):
    %n = arith.negf %a : f32
    linalg.yield %n : f32
  } -> tensor<2x3xf32>
  return %y, %y : tensor<2x3xf32>, tensor<2x3xf32>
}
