// RUN: kinac opt %s --passes copies-to-linalg | FileCheck %s

// After bufferization each memref.copy becomes a linalg.copy (plain loops, not a
// call to the memrefCopy runtime function); a copy of a buffer onto itself is erased.

// A concat's slot: the copy into a strided subview of an out-buffer.
// CHECK-LABEL: func.func @into_subview(
// CHECK-SAME:    %[[A:[^:]+]]: memref<2x3xf32, strided<[?, 1], offset: ?>>, %[[OUT:[^:]+]]: memref<2x4xf32, strided<[?, 1], offset: ?>>)
// CHECK:         %[[SLOT:.+]] = memref.subview %[[OUT]][0, 0] [2, 3] [1, 1]
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[A]] : memref<2x3xf32, strided<[?, 1], offset: ?>>) outs(%[[SLOT]] : memref<2x3xf32, strided<[?, 1], offset: ?>>)
// CHECK-NEXT:    return
func.func @into_subview(%a: memref<2x3xf32, strided<[?, 1], offset: ?>>, %out: memref<2x4xf32, strided<[?, 1], offset: ?>>) {
  %slot = memref.subview %out[0, 0] [2, 3] [1, 1] : memref<2x4xf32, strided<[?, 1], offset: ?>> to memref<2x3xf32, strided<[?, 1], offset: ?>>
  memref.copy %a, %slot : memref<2x3xf32, strided<[?, 1], offset: ?>> to memref<2x3xf32, strided<[?, 1], offset: ?>>
  return
}

// Different layouts on each side, symbolic sizes, and a rank-0 copy.
// CHECK-LABEL: func.func @layouts(
// CHECK-SAME:    %[[A:[^:]+]]: memref<?x?xf32>, %[[B:[^:]+]]: memref<?x?xf32, strided<[?, 1], offset: ?>>, %[[S:[^:]+]]: memref<f32>, %[[T:[^:]+]]: memref<f32, strided<[], offset: ?>>)
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[A]] : memref<?x?xf32>) outs(%[[B]] : memref<?x?xf32, strided<[?, 1], offset: ?>>)
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[S]] : memref<f32>) outs(%[[T]] : memref<f32, strided<[], offset: ?>>)
// CHECK-NEXT:    return
func.func @layouts(%a: memref<?x?xf32>, %b: memref<?x?xf32, strided<[?, 1], offset: ?>>, %s: memref<f32>, %t: memref<f32, strided<[], offset: ?>>) {
  memref.copy %a, %b : memref<?x?xf32> to memref<?x?xf32, strided<[?, 1], offset: ?>>
  memref.copy %s, %t : memref<f32> to memref<f32, strided<[], offset: ?>>
  return
}

// What bufferize leaves where a result was computed in its out-buffer: a copy of
// that buffer onto itself, erased; the other copy stays, as a linalg.copy.
// CHECK-LABEL: func.func @self_copy(
// CHECK-SAME:    %[[X:[^:]+]]: memref<2x3xf32, strided<[?, 1], offset: ?>>, %[[OUT0:[^:]+]]: memref<2x3xf32, strided<[?, 1], offset: ?>>, %[[OUT1:[^:]+]]: memref<2x3xf32, strided<[?, 1], offset: ?>>)
// CHECK:         linalg.generic {{.*}} ins(%[[X]] : {{.*}}) outs(%[[OUT0]] : {{.*}})
// CHECK:         }
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[OUT0]] : {{.*}}) outs(%[[OUT1]] : {{.*}})
// CHECK-NEXT:    return
func.func @self_copy(%x: memref<2x3xf32, strided<[?, 1], offset: ?>>, %out0: memref<2x3xf32, strided<[?, 1], offset: ?>>, %out1: memref<2x3xf32, strided<[?, 1], offset: ?>>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<2x3xf32, strided<[?, 1], offset: ?>>) outs(%out0 : memref<2x3xf32, strided<[?, 1], offset: ?>>) {
  ^bb0(%a: f32, %o: f32):
    %n = arith.negf %a : f32
    linalg.yield %n : f32
  }
  memref.copy %out0, %out0 : memref<2x3xf32, strided<[?, 1], offset: ?>> to memref<2x3xf32, strided<[?, 1], offset: ?>>
  memref.copy %out0, %out1 : memref<2x3xf32, strided<[?, 1], offset: ?>> to memref<2x3xf32, strided<[?, 1], offset: ?>>
  return
}

// A copy between the same view made twice (a concat's prefix in its out-buffer, the
// subview taken once by bufferize for the slot and once for the copy) is erased too.
// Views that differ in an offset, a size or their buffer are not the same memory, and
// their copies stay.
// CHECK-LABEL: func.func @same_view(
// CHECK-SAME:    %[[OUT:[^:]+]]: memref<8x?xf32, strided<[?, 1], offset: ?>>, %[[OTHER:[^:]+]]: memref<8x?xf32, strided<[?, 1], offset: ?>>, %[[S:[^:]+]]: index)
// CHECK-NEXT:    %[[P:.+]] = memref.subview %[[OUT]][0, 0] [8, %[[S]]] [1, 1]
// CHECK-NEXT:    memref.subview %[[OUT]][0, 0] [8, %[[S]]] [1, 1]
// CHECK-NEXT:    %[[Q:.+]] = memref.subview %[[OUT]][0, 1] [8, %[[S]]] [1, 1]
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[P]] : {{.*}}) outs(%[[Q]] : {{.*}})
// CHECK:         %[[R:.+]] = memref.subview %[[OTHER]][0, 0] [8, %[[S]]] [1, 1]
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[P]] : {{.*}}) outs(%[[R]] : {{.*}})
// CHECK-NEXT:    return
func.func @same_view(%out: memref<8x?xf32, strided<[?, 1], offset: ?>>, %other: memref<8x?xf32, strided<[?, 1], offset: ?>>, %s: index) {
  %a = memref.subview %out[0, 0] [8, %s] [1, 1] : memref<8x?xf32, strided<[?, 1], offset: ?>> to memref<8x?xf32, strided<[?, 1], offset: ?>>
  %b = memref.subview %out[0, 0] [8, %s] [1, 1] : memref<8x?xf32, strided<[?, 1], offset: ?>> to memref<8x?xf32, strided<[?, 1], offset: ?>>
  memref.copy %a, %b : memref<8x?xf32, strided<[?, 1], offset: ?>> to memref<8x?xf32, strided<[?, 1], offset: ?>>
  %c = memref.subview %out[0, 1] [8, %s] [1, 1] : memref<8x?xf32, strided<[?, 1], offset: ?>> to memref<8x?xf32, strided<[?, 1], offset: ?>>
  memref.copy %a, %c : memref<8x?xf32, strided<[?, 1], offset: ?>> to memref<8x?xf32, strided<[?, 1], offset: ?>>
  %d = memref.subview %other[0, 0] [8, %s] [1, 1] : memref<8x?xf32, strided<[?, 1], offset: ?>> to memref<8x?xf32, strided<[?, 1], offset: ?>>
  memref.copy %a, %d : memref<8x?xf32, strided<[?, 1], offset: ?>> to memref<8x?xf32, strided<[?, 1], offset: ?>>
  return
}
