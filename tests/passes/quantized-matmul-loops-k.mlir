// RUN: kinac opt %s --passes quantized-matmul-loops | FileCheck %s

// A Q4_K matmul (256-element blocks): each block runs its 8 sub-blocks of 32 in a loop
// (%sb), each unrolled over its elements e = 32 sb + l. The formula's index arithmetic
// folds (e // 32 is sb, e % 32 the constant l; its one division is e // 64 = sb // 2), and
// what depends on sb alone is built once per sub-block: the 6-bit scale and min are
// selected once, d * sc and -(dmin * m) computed once, and all 32 elements' weights are
// fused multiply-adds of those two with their own quant.

// CHECK-LABEL: func.func @kina_project(
// CHECK:         scf.for %{{.+}} iter_args(%{{.+}}) -> (vector<16xf32>)
// CHECK:           scf.for %[[SB:[^ ]+]] = %{{.+}} iter_args(%{{.+}}) -> (vector<16xf32>)
// CHECK:             arith.divui %[[SB]], %{{.+}} : index
// CHECK-NOT:         arith.divui
// CHECK:             arith.select
// CHECK-NOT:         arith.divui
// CHECK:             arith.select
// CHECK-NOT:         arith.select
// CHECK:             %[[A:.+]] = arith.mulf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK-NEXT:        %[[M:.+]] = arith.mulf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK-NEXT:        %[[C:.+]] = arith.negf %[[M]] : vector<16xf32>
// CHECK-COUNT-32:    math.fma %[[A]], %{{.+}}, %[[C]] : vector<16xf32>
// CHECK-NOT:         math.fma
// CHECK-NOT:         arith.divui
// CHECK-NOT:         arith.select
// CHECK:             scf.yield
// CHECK-NOT:     kina.quantized
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 144 + (d3 floordiv 64) * 32 + d3 mod 32 + 16) * 16 + d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 144 + (d3 floordiv 32) mod 4 + 4) * 16 + d4)>
#map3 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 144 + (d3 floordiv 32) mod 4 + 12) * 16 + d4)>
#map4 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 144 + (d3 floordiv 32) mod 4 + 8) * 16 + d4)>
#map5 = affine_map<(d0, d1, d2, d3, d4) -> (d1, d2 * 2304 + d4)>
#map6 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 144 + 1) * 16 + d4)>
#map7 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 144 + 2) * 16 + d4)>
#map8 = affine_map<(d0, d1, d2, d3, d4) -> (d1, (d2 * 144 + 3) * 16 + d4)>
#map9 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4)>
module attributes {kina.layouts = {project = {w = "tiled16"}}} {
  func.func @kina_project(%x: memref<1x256xf32, strided<[?, 1], offset: ?>>, %w: memref<2x2304xi8, strided<[?, 1], offset: ?>>, %out0: memref<1x32xf32, strided<[?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
    %cst = arith.constant 0.000000e+00 : f32
    %alloc = memref.alloc() {alignment = 64 : i64} : memref<1x32xf32>
    linalg.fill ins(%cst : f32) outs(%alloc : memref<1x32xf32>)
    %expand_shape = memref.expand_shape %x [[0], [1, 2]] output_shape [1, 1, 256] : memref<1x256xf32, strided<[?, 1], offset: ?>> into memref<1x1x256xf32, strided<[?, 256, 1], offset: ?>>
    %expand_shape_0 = memref.expand_shape %alloc [[0], [1, 2]] output_shape [1, 2, 16] : memref<1x32xf32> into memref<1x2x16xf32>
    linalg.generic {indexing_maps = [#map, #map1, #map2, #map3, #map4, #map5, #map6, #map7, #map8, #map9], iterator_types = ["parallel", "parallel", "reduction", "reduction", "parallel"]} ins(%expand_shape, %w, %w, %w, %w, %w, %w, %w, %w : memref<1x1x256xf32, strided<[?, 256, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>, memref<2x2304xi8, strided<[?, 1], offset: ?>>) outs(%expand_shape_0 : memref<1x2x16xf32>) attrs =  {kina.quantized = "Q4_K", kina.tiled} {
    ^bb0(%in: f32, %in_1: i8, %in_2: i8, %in_3: i8, %in_4: i8, %in_5: i8, %in_6: i8, %in_7: i8, %in_8: i8, %out: f32):
      %0 = arith.extui %in_1 : i8 to i32
      %1 = linalg.index 3 : index
      %c32 = arith.constant 32 : index
      %2 = arith.divui %1, %c32 : index
      %c2 = arith.constant 2 : index
      %3 = arith.remui %2, %c2 : index
      %c4 = arith.constant 4 : index
      %4 = arith.muli %3, %c4 : index
      %5 = arith.index_cast %4 : index to i32
      %6 = arith.shrui %0, %5 : i32
      %c15_i32 = arith.constant 15 : i32
      %7 = arith.andi %6, %c15_i32 : i32
      %8 = linalg.index 3 : index
      %c32_9 = arith.constant 32 : index
      %9 = arith.divui %8, %c32_9 : index
      %c4_10 = arith.constant 4 : index
      %10 = arith.cmpi ult, %9, %c4_10 : index
      %11 = arith.extui %in_2 : i8 to i32
      %c63_i32 = arith.constant 63 : i32
      %12 = arith.andi %11, %c63_i32 : i32
      %13 = arith.extui %in_3 : i8 to i32
      %c15_i32_11 = arith.constant 15 : i32
      %14 = arith.andi %13, %c15_i32_11 : i32
      %15 = arith.extui %in_2 : i8 to i32
      %c6_i32 = arith.constant 6 : i32
      %16 = arith.shrui %15, %c6_i32 : i32
      %c4_i32 = arith.constant 4 : i32
      %17 = arith.shli %16, %c4_i32 : i32
      %18 = arith.ori %14, %17 : i32
      %19 = arith.select %10, %12, %18 : i32
      %20 = arith.extui %in_4 : i8 to i32
      %c63_i32_12 = arith.constant 63 : i32
      %21 = arith.andi %20, %c63_i32_12 : i32
      %22 = arith.extui %in_3 : i8 to i32
      %c4_i32_13 = arith.constant 4 : i32
      %23 = arith.shrui %22, %c4_i32_13 : i32
      %24 = arith.extui %in_4 : i8 to i32
      %c6_i32_14 = arith.constant 6 : i32
      %25 = arith.shrui %24, %c6_i32_14 : i32
      %c4_i32_15 = arith.constant 4 : i32
      %26 = arith.shli %25, %c4_i32_15 : i32
      %27 = arith.ori %23, %26 : i32
      %28 = arith.select %10, %21, %27 : i32
      %29 = arith.extui %in_5 : i8 to i32
      %30 = arith.extui %in_6 : i8 to i32
      %c8_i32 = arith.constant 8 : i32
      %31 = arith.shli %30, %c8_i32 : i32
      %32 = arith.ori %29, %31 : i32
      %33 = arith.trunci %32 : i32 to i16
      %34 = arith.bitcast %33 : i16 to f16
      %35 = arith.extf %34 : f16 to f32
      %36 = arith.sitofp %19 : i32 to f32
      %37 = arith.mulf %35, %36 : f32
      %38 = arith.extui %in_7 : i8 to i32
      %39 = arith.extui %in_8 : i8 to i32
      %c8_i32_16 = arith.constant 8 : i32
      %40 = arith.shli %39, %c8_i32_16 : i32
      %41 = arith.ori %38, %40 : i32
      %42 = arith.trunci %41 : i32 to i16
      %43 = arith.bitcast %42 : i16 to f16
      %44 = arith.extf %43 : f16 to f32
      %45 = arith.sitofp %28 : i32 to f32
      %46 = arith.mulf %44, %45 : f32
      %47 = arith.sitofp %7 : i32 to f32
      %48 = arith.mulf %37, %47 : f32
      %49 = arith.subf %48, %46 : f32
      %50 = arith.mulf %in, %49 : f32
      %51 = arith.addf %out, %50 : f32
      linalg.yield %51 : f32
    }
    %collapse_shape = memref.collapse_shape %expand_shape_0 [[0], [1, 2]] : memref<1x2x16xf32> into memref<1x32xf32>
    linalg.copy {cast = #linalg.type_fn<cast_signed>} ins(%collapse_shape : memref<1x32xf32>) outs(%out0 : memref<1x32xf32, strided<[?, 1], offset: ?>>)
    return
  }
}
