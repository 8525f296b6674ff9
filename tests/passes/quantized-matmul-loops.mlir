// RUN: kinac opt %s --passes quantized-matmul-loops | FileCheck %s
// RUN: kinac opt %s --passes 'quantized-matmul-loops{block-sums=true}' | FileCheck %s --check-prefix=SUMS

// A fused quantized matmul (fuse-dequant-matmul's, its weight in 16-column tiles) becomes
// vector loops: for each row and tile of 16 columns, a vector of sums carried through the
// blocks (kb); in each block every element e loads byte e's vector of the tile's 16 columns
// (nibble bytes shared by e and e + 16), widens it (the format's element: d * q + m, the
// exact product and the offset one fused multiply-add) and adds x * w in k order, as the
// generic's body does. With block-sums, each block first sums x * q (fused multiply-adds)
// and then adds d * that + m * sum(x).

// CHECK-LABEL: func.func @kina_project(
// CHECK:         scf.for
// CHECK:           %[[A0:.+]] = vector.load %{{.+}} : memref<1x2x16xf32>, vector<16xf32>
// CHECK:           %[[A:.+]] = scf.for %{{.+}} iter_args(%[[ACC:.+]] = %[[A0]]) -> (vector<16xf32>)
// CHECK:             vector.load %{{.+}} : memref<2x640xi8, strided<[?, 1], offset: ?>>, vector<16xi8>
// CHECK:             %[[Q:.+]] = arith.sitofp %{{.+}} : vector<16xi32> to vector<16xf32>
// CHECK-NEXT:        %[[W:.+]] = math.fma %{{.+}}, %[[Q]], %{{.+}} : vector<16xf32>
// CHECK:             %[[P:.+]] = arith.mulf %{{.+}}, %[[W]] : vector<16xf32>
// CHECK-NEXT:        arith.addf %[[ACC]], %[[P]] : vector<16xf32>
// CHECK:           vector.store %[[A]], %{{.+}} : memref<1x2x16xf32>, vector<16xf32>
// CHECK-NOT:     kina.quantized

// SUMS-LABEL: func.func @kina_project(
// SUMS:           %[[A:.+]] = scf.for %{{.+}} iter_args(%[[ACC:.+]] = %{{.+}}) -> (vector<16xf32>)
// SUMS:             %[[Q:.+]] = arith.sitofp %{{.+}} : vector<16xi32> to vector<16xf32>
// SUMS:             math.fma %{{.+}}, %[[Q]], %{{.+}} : vector<16xf32>
// SUMS-NOT:         arith.mulf
// SUMS:             %[[SCALED:.+]] = math.fma %{{.+}}, %{{.+}}, %[[ACC]] : vector<16xf32>
// SUMS-NEXT:        %[[NEXT:.+]] = math.fma %{{.+}}, %{{.+}}, %[[SCALED]] : vector<16xf32>
// SUMS-NEXT:        scf.yield %[[NEXT]] : vector<16xf32>
// SUMS:           vector.store %[[A]]
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 20 + d3 mod 16 + 4) * 16 + d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d1, d2 * 320 + d4)>
#map3 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 20 + 1) * 16 + d4)>
#map4 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 20 + 2) * 16 + d4)>
#map5 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 20 + 3) * 16 + d4)>
#map6 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>
module attributes {kina.layouts = {project = {w = "tiled16"}}} {
  func.func @kina_project(%x: memref<1x64xf32, strided<[?, 1], offset: ?>>, %w: memref<2x640xi8, strided<[?, 1], offset: ?>>, %out0: memref<1x32xf32, strided<[?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
    %cst = arith.constant 0.000000e+00 : f32
    %alloc = memref.alloc() {alignment = 64 : i64} : memref<1x32xf32>
    linalg.fill ins(%cst : f32) outs(%alloc : memref<1x32xf32>)
    %expand_shape = memref.expand_shape %x [[0], [1, 2]] output_shape [1, 2, 32] : memref<1x64xf32, strided<[?, 1], offset: ?>> into memref<1x2x32xf32, strided<[?, 32, 1], offset: ?>>
    %expand_shape_0 = memref.expand_shape %alloc [[0], [1, 2]] output_shape [1, 2, 16] : memref<1x32xf32> into memref<1x2x16xf32>
    linalg.generic {indexing_maps = [#map, #map1, #map2, #map3, #map4, #map5, #map6], iterator_types = ["parallel", "parallel", "reduction", "reduction", "parallel"]} ins(%expand_shape, %w, %w, %w, %w, %w : memref<1x2x32xf32, strided<[?, 32, 1], offset: ?>>, memref<2x640xi8, strided<[?, 1], offset: ?>>, memref<2x640xi8, strided<[?, 1], offset: ?>>, memref<2x640xi8, strided<[?, 1], offset: ?>>, memref<2x640xi8, strided<[?, 1], offset: ?>>, memref<2x640xi8, strided<[?, 1], offset: ?>>) outs(%expand_shape_0 : memref<1x2x16xf32>) attrs =  {kina.quantized = "Q4_1", kina.tiled} {
    ^bb0(%in: f32, %in_1: i8, %in_2: i8, %in_3: i8, %in_4: i8, %in_5: i8, %out: f32):
      %0 = arith.extui %in_1 : i8 to i32
      %1 = linalg.index 3 : index
      %c16 = arith.constant 16 : index
      %2 = arith.divui %1, %c16 : index
      %c4 = arith.constant 4 : index
      %3 = arith.muli %2, %c4 : index
      %4 = arith.index_cast %3 : index to i32
      %5 = arith.shrui %0, %4 : i32
      %c15_i32 = arith.constant 15 : i32
      %6 = arith.andi %5, %c15_i32 : i32
      %7 = arith.extui %in_2 : i8 to i32
      %8 = arith.extui %in_3 : i8 to i32
      %c8_i32 = arith.constant 8 : i32
      %9 = arith.shli %8, %c8_i32 : i32
      %10 = arith.ori %7, %9 : i32
      %11 = arith.trunci %10 : i32 to i16
      %12 = arith.bitcast %11 : i16 to f16
      %13 = arith.extf %12 : f16 to f32
      %14 = arith.extui %in_4 : i8 to i32
      %15 = arith.extui %in_5 : i8 to i32
      %c8_i32_6 = arith.constant 8 : i32
      %16 = arith.shli %15, %c8_i32_6 : i32
      %17 = arith.ori %14, %16 : i32
      %18 = arith.trunci %17 : i32 to i16
      %19 = arith.bitcast %18 : i16 to f16
      %20 = arith.extf %19 : f16 to f32
      %21 = arith.sitofp %6 : i32 to f32
      %22 = arith.mulf %13, %21 : f32
      %23 = arith.addf %22, %20 : f32
      %24 = arith.mulf %in, %23 : f32
      %25 = arith.addf %out, %24 : f32
      linalg.yield %25 : f32
    }
    %collapse_shape = memref.collapse_shape %expand_shape_0 [[0], [1, 2]] : memref<1x2x16xf32> into memref<1x32xf32>
    linalg.copy {cast = #linalg.type_fn<cast_signed>} ins(%collapse_shape : memref<1x32xf32>) outs(%out0 : memref<1x32xf32, strided<[?, 1], offset: ?>>)
    return
  }
}
