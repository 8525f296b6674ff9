// RUN: kinac opt %s --passes 'split-k{min-bytes=1024 chunks=16}' | FileCheck %s
// RUN: kinac opt %s --passes 'split-k{min-bytes=1024}' | FileCheck %s --check-prefix=EIGHT

// A decode row x[1, 1, K] @ w[K, N] becomes a batched matmul of 16 chunks of k (here; 8 by default: EIGHT) (views
// of x and of blocks of w's rows, from their own offsets) into a temporary of 16
// partial rows, then a sum of those rows into the output, the chunk dim outermost.

#lhs = affine_map<(b, i, k, j) -> (b, i, k)>
#rhs = affine_map<(b, i, k, j) -> (k, j)>
#out = affine_map<(b, i, k, j) -> (b, i, j)>

// CHECK-LABEL: func.func @chunked(
// CHECK-SAME:    %[[X:[^:]+]]: memref<1x1x64xf32>, %[[W:[^:]+]]: memref<64x128xf32, strided<[?, 1], offset: ?>>, %[[ACC:[^:]+]]: memref<1x1x128xf32>
// CHECK:         %[[XC:.+]] = memref.reinterpret_cast %[[X]] to offset: [%{{.+}}], sizes: [16, 1, 4], strides: [4, 4, 1]
// CHECK:         %[[S:.+]] = arith.muli %[[ROW:.+]], %c4
// CHECK:         %[[WC:.+]] = memref.reinterpret_cast %[[W]] to offset: [%{{.+}}], sizes: [16, 4, 128], strides: [%[[S]], %[[ROW]], 1]
// CHECK:         %[[P:.+]] = memref.alloc() : memref<16x1x128xf32>
// CHECK:         linalg.fill ins(%{{.+}} : f32) outs(%[[P]] : memref<16x1x128xf32>)
// CHECK:         linalg.generic {{.+}} iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%[[XC]], %[[WC]] : {{.+}}) outs(%[[P]] : memref<16x1x128xf32>) attrs =  {kina.one_row_at_a_time}
// CHECK:           arith.mulf
// CHECK:           arith.addf
// CHECK:         linalg.generic {{.+}} iterator_types = ["reduction", "parallel", "parallel", "parallel"]} ins(%[[P]] : memref<16x1x128xf32>) outs(%[[ACC]] : memref<1x1x128xf32>)
// CHECK:           arith.addf
// CHECK-NOT:     linalg.generic
// CHECK:         return
// EIGHT-LABEL: func.func @chunked(
// EIGHT:         memref.reinterpret_cast %{{.+}} to offset: [%{{.+}}], sizes: [8, 1, 8], strides: [8, 8, 1]
// EIGHT:         memref.reinterpret_cast %{{.+}} to offset: [%{{.+}}], sizes: [8, 8, 128]
// EIGHT:         memref.alloc() : memref<8x1x128xf32>
func.func @chunked(%x: memref<1x1x64xf32>, %w: memref<64x128xf32, strided<[?, 1], offset: ?>>, %acc: memref<1x1x128xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<1x1x64xf32>, memref<64x128xf32, strided<[?, 1], offset: ?>>) outs(%acc : memref<1x1x128xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// F16 operands, F32 sums: the chunks' body widens them as the matmul's did.
// CHECK-LABEL: func.func @widening(
// CHECK:         memref.alloc() : memref<16x1x128xf32>
// CHECK:         linalg.generic {{.+}} ins(%{{.+}}, %{{.+}} : memref<16x1x4xf16, {{.+}}>, memref<16x4x128xf16, {{.+}}>) outs(%{{.+}} : memref<16x1x128xf32>)
// CHECK:           arith.extf
// CHECK:           arith.extf
// CHECK:         return
func.func @widening(%x: memref<1x1x64xf16>, %w: memref<64x128xf16>, %acc: memref<1x1x128xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<1x1x64xf16>, memref<64x128xf16>) outs(%acc : memref<1x1x128xf32>) {
  ^bb0(%a: f16, %b: f16, %s: f32):
    %ea = arith.extf %a : f16 to f32
    %eb = arith.extf %b : f16 to f32
    %m = arith.mulf %ea, %eb : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// Left alone: two output rows (a prompt's), K not a multiple of the chunks, a
// symbolic N, and a weight under min-bytes.
// CHECK-LABEL: func.func @left_alone(
// CHECK-NOT:     memref.reinterpret_cast
// CHECK:         return
#lhs2 = affine_map<(i, k, j) -> (i, k)>
#rhs2 = affine_map<(i, k, j) -> (k, j)>
#out2 = affine_map<(i, k, j) -> (i, j)>
func.func @left_alone(%x2: memref<2x64xf32>, %w: memref<64x128xf32>, %acc2: memref<2x128xf32>,
                      %x60: memref<1x60xf32>, %w60: memref<60x128xf32>, %acc1: memref<1x128xf32>,
                      %x1: memref<1x64xf32>, %wn: memref<64x?xf32>, %accn: memref<1x?xf32>,
                      %x8: memref<1x16xf32>, %w8: memref<16x8xf32>, %acc8: memref<1x8xf32>) {
  linalg.generic {indexing_maps = [#lhs2, #rhs2, #out2], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x2, %w : memref<2x64xf32>, memref<64x128xf32>) outs(%acc2 : memref<2x128xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#lhs2, #rhs2, #out2], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x60, %w60 : memref<1x60xf32>, memref<60x128xf32>) outs(%acc1 : memref<1x128xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#lhs2, #rhs2, #out2], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x1, %wn : memref<1x64xf32>, memref<64x?xf32>) outs(%accn : memref<1x?xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#lhs2, #rhs2, #out2], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x8, %w8 : memref<1x16xf32>, memref<16x8xf32>) outs(%acc8 : memref<1x8xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}
