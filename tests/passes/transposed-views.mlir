// RUN: kinac opt %s --passes transposed-views | FileCheck %s

// A transposed copy that only matmuls read (w @ xᵀ, a weight stored [out, in]) becomes
// a memref.transpose view of its source: the matmul then reads an rhs that runs along
// k, which matmul-loops takes as dot products of rows. The copy's buffer is erased.

#lhs = affine_map<(i, k, j) -> (i, k)>
#rhs = affine_map<(i, k, j) -> (k, j)>
#out = affine_map<(i, k, j) -> (i, j)>
#id = affine_map<(i, j) -> (i, j)>

// CHECK-LABEL: func.func @folded(
// CHECK-SAME:    %[[X:[^:]+]]: memref<?x576xf32, strided<[?, 1], offset: ?>>, %[[W:[^:]+]]: memref<1536x576xf32>
// CHECK:         %[[T:.+]] = memref.transpose %[[X]] (d0, d1) -> (d1, d0) : memref<?x576xf32, strided<[?, 1], offset: ?>> to memref<576x?xf32, strided<[1, ?], offset: ?>>
// CHECK-NOT:     linalg.transpose
// CHECK:         linalg.generic {{.+}} ins(%[[W]], %[[T]] : memref<1536x576xf32>, memref<576x?xf32, strided<[1, ?], offset: ?>>)
// CHECK-NOT:     memref.alloc(%{{.+}}) {{.*}}: memref<576x?xf32>
// CHECK:         return
func.func @folded(%x: memref<?x576xf32, strided<[?, 1], offset: ?>>, %w: memref<1536x576xf32>, %acc: memref<1536x?xf32>) {
  %c0 = arith.constant 0 : index
  %p = memref.dim %x, %c0 : memref<?x576xf32, strided<[?, 1], offset: ?>>
  %t = memref.alloc(%p) : memref<576x?xf32>
  linalg.transpose ins(%x : memref<?x576xf32, strided<[?, 1], offset: ?>>) outs(%t : memref<576x?xf32>) permutation = [1, 0]
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%acc : memref<1536x?xf32>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%w, %t : memref<1536x576xf32>, memref<576x?xf32>) outs(%acc : memref<1536x?xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// The source is written between the transpose and the matmul: the copy holds the
// values from before, so it stays.
// CHECK-LABEL: func.func @written_between(
// CHECK:         linalg.transpose
// CHECK-NOT:     memref.transpose
// CHECK:         return
func.func @written_between(%x: memref<4x8xf32>, %w: memref<16x8xf32>, %acc: memref<16x4xf32>) {
  %t = memref.alloc() : memref<8x4xf32>
  linalg.transpose ins(%x : memref<4x8xf32>) outs(%t : memref<8x4xf32>) permutation = [1, 0]
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%x : memref<4x8xf32>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%w, %t : memref<16x8xf32>, memref<8x4xf32>) outs(%acc : memref<16x4xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// Something other than a matmul reads the copy too: it stays.
// CHECK-LABEL: func.func @other_reader(
// CHECK:         linalg.transpose
// CHECK-NOT:     memref.transpose
// CHECK:         return
func.func @other_reader(%x: memref<4x8xf32>, %w: memref<16x8xf32>, %acc: memref<16x4xf32>, %y: memref<8x4xf32>) {
  %t = memref.alloc() : memref<8x4xf32>
  linalg.transpose ins(%x : memref<4x8xf32>) outs(%t : memref<8x4xf32>) permutation = [1, 0]
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%w, %t : memref<16x8xf32>, memref<8x4xf32>) outs(%acc : memref<16x4xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : memref<8x4xf32>) outs(%y : memref<8x4xf32>) {
  ^bb0(%a: f32, %b: f32):
    linalg.yield %a : f32
  }
  return
}
