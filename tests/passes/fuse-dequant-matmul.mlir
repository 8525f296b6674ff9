// RUN: kinac opt %s --passes fuse-dequant-matmul | FileCheck %s

// A matmul whose rhs is a dequantization (kina.ir.blocks: one generic over (kb, e, n) reading
// each byte of a block through its own map) becomes one generic over (i, jt, kb, e, jl) that
// dequantizes each weight as it reads it. A weight only fused matmuls read is retyped to its
// 16-column tiles ([N / 16, row bytes * 16]) and the module records that layout; one that a
// convert reads too keeps GGUF's rows, and its fused generic reads it through the row view.

// CHECK: module attributes {kina.layouts = {project = {arg1 = "tiled16"}}}
// CHECK-LABEL: func.func @project(
// CHECK-SAME:    %[[X:[^:]+]]: tensor<1x64xf32>, %[[W:[^:]+]]: tensor<2x640xi8>)
// CHECK:         %[[X3:.+]] = tensor.expand_shape %[[X]] {{\[\[}}0], [1, 2]] output_shape [1, 2, 32]
// CHECK:         %[[Y3:.+]] = linalg.generic
// CHECK-SAME:      iterator_types = ["parallel", "parallel", "reduction", "reduction", "parallel"]
// CHECK-SAME:      ins(%[[X3]], %[[W]], %[[W]], %[[W]], %[[W]], %[[W]] :
// CHECK-SAME:      kina.quantized = "Q4_1", kina.tiled
// CHECK:           arith.sitofp
// CHECK-NEXT:      %[[DQ:.+]] = arith.mulf
// CHECK-NEXT:      %[[W1:.+]] = arith.addf %[[DQ]]
// CHECK-NEXT:      %[[P:.+]] = arith.mulf %{{.+}}, %[[W1]] : f32
// CHECK-NEXT:      %[[S:.+]] = arith.addf %{{.+}}, %[[P]] : f32
// CHECK-NEXT:      linalg.yield %[[S]] : f32
// CHECK:         %[[Y:.+]] = tensor.collapse_shape %[[Y3]] {{\[\[}}0], [1, 2]] : tensor<1x2x16xf32> into tensor<1x32xf32>
// CHECK-NOT:     kina.dequantize
// CHECK:         return %[[Y]]

// CHECK-LABEL: func.func @both(
// CHECK-SAME:    %{{[^:]+}}: tensor<1x64xf32>, %[[B:[^:]+]]: tensor<32x68xi8>)
// CHECK:         %[[ROWS:.+]] = tensor.expand_shape %[[B]] {{\[\[}}0], [1, 2]] output_shape [32, 2, 34]
// CHECK:         linalg.generic
// CHECK-SAME:      ins(%{{.+}}, %[[ROWS]], %[[ROWS]], %[[ROWS]] :
// CHECK-SAME:      kina.quantized = "Q8_0"
// CHECK:         linalg.generic
// CHECK-SAME:      kina.dequantize = "Q8_0"
#map = affine_map<(d0, d1, d2) -> (d2, d0, d1 mod 16 + 4)>
#map1 = affine_map<(d0, d1, d2) -> (d2, d0, 0)>
#map2 = affine_map<(d0, d1, d2) -> (d2, d0, 1)>
#map3 = affine_map<(d0, d1, d2) -> (d2, d0, 2)>
#map4 = affine_map<(d0, d1, d2) -> (d2, d0, 3)>
#map5 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map6 = affine_map<(d0, d1, d2) -> (d0, d1)>
#map7 = affine_map<(d0, d1, d2) -> (d1, d2)>
#map8 = affine_map<(d0, d1, d2) -> (d0, d2)>
#map9 = affine_map<(d0, d1, d2) -> (d2, d0, d1 + 2)>
module {
  func.func @project(%x: tensor<1x64xf32>, %w: tensor<32x40xi8>) -> tensor<1x32xf32> {
    %expanded = tensor.expand_shape %w [[0], [1, 2]] output_shape [32, 2, 20] : tensor<32x40xi8> into tensor<32x2x20xi8>
    %0 = tensor.empty() : tensor<2x32x32xf32>
    %1 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map3, #map4, #map5], iterator_types = ["parallel", "parallel", "parallel"]} ins(%expanded, %expanded, %expanded, %expanded, %expanded : tensor<32x2x20xi8>, tensor<32x2x20xi8>, tensor<32x2x20xi8>, tensor<32x2x20xi8>, tensor<32x2x20xi8>) outs(%0 : tensor<2x32x32xf32>) attrs =  {kina.dequantize = "Q4_1"} {
    ^bb0(%in: i8, %in_0: i8, %in_1: i8, %in_2: i8, %in_3: i8, %out: f32):
      %5 = arith.extui %in : i8 to i32
      %6 = linalg.index 1 : index
      %c16 = arith.constant 16 : index
      %7 = arith.divui %6, %c16 : index
      %c4 = arith.constant 4 : index
      %8 = arith.muli %7, %c4 : index
      %9 = arith.index_cast %8 : index to i32
      %10 = arith.shrui %5, %9 : i32
      %c15_i32 = arith.constant 15 : i32
      %11 = arith.andi %10, %c15_i32 : i32
      %12 = arith.extui %in_0 : i8 to i32
      %13 = arith.extui %in_1 : i8 to i32
      %c8_i32 = arith.constant 8 : i32
      %14 = arith.shli %13, %c8_i32 : i32
      %15 = arith.ori %12, %14 : i32
      %16 = arith.trunci %15 : i32 to i16
      %17 = arith.bitcast %16 : i16 to f16
      %18 = arith.extf %17 : f16 to f32
      %19 = arith.extui %in_2 : i8 to i32
      %20 = arith.extui %in_3 : i8 to i32
      %c8_i32_4 = arith.constant 8 : i32
      %21 = arith.shli %20, %c8_i32_4 : i32
      %22 = arith.ori %19, %21 : i32
      %23 = arith.trunci %22 : i32 to i16
      %24 = arith.bitcast %23 : i16 to f16
      %25 = arith.extf %24 : f16 to f32
      %26 = arith.sitofp %11 : i32 to f32
      %27 = arith.mulf %18, %26 : f32
      %28 = arith.addf %27, %25 : f32
      linalg.yield %28 : f32
    } -> tensor<2x32x32xf32>
    %collapsed = tensor.collapse_shape %1 [[0, 1], [2]] : tensor<2x32x32xf32> into tensor<64x32xf32>
    %cst = arith.constant 0.000000e+00 : f32
    %2 = tensor.empty() : tensor<1x32xf32>
    %3 = linalg.fill ins(%cst : f32) outs(%2 : tensor<1x32xf32>) -> tensor<1x32xf32>
    %4 = linalg.generic {indexing_maps = [#map6, #map7, #map8], iterator_types = ["parallel", "reduction", "parallel"]} ins(%x, %collapsed : tensor<1x64xf32>, tensor<64x32xf32>) outs(%3 : tensor<1x32xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %5 = arith.mulf %in, %in_0 : f32
      %6 = arith.addf %out, %5 : f32
      linalg.yield %6 : f32
    } -> tensor<1x32xf32>
    return %4 : tensor<1x32xf32>
  }
  func.func @both(%x: tensor<1x64xf32>, %w: tensor<32x68xi8>) -> (tensor<1x32xf32>, tensor<64x32xf32>) {
    %expanded = tensor.expand_shape %w [[0], [1, 2]] output_shape [32, 2, 34] : tensor<32x68xi8> into tensor<32x2x34xi8>
    %0 = tensor.empty() : tensor<2x32x32xf32>
    %1 = linalg.generic {indexing_maps = [#map1, #map2, #map9, #map5], iterator_types = ["parallel", "parallel", "parallel"]} ins(%expanded, %expanded, %expanded : tensor<32x2x34xi8>, tensor<32x2x34xi8>, tensor<32x2x34xi8>) outs(%0 : tensor<2x32x32xf32>) attrs =  {kina.dequantize = "Q8_0"} {
    ^bb0(%in: i8, %in_2: i8, %in_3: i8, %out: f32):
      %7 = arith.extui %in : i8 to i32
      %8 = arith.extui %in_2 : i8 to i32
      %c8_i32 = arith.constant 8 : i32
      %9 = arith.shli %8, %c8_i32 : i32
      %10 = arith.ori %7, %9 : i32
      %11 = arith.trunci %10 : i32 to i16
      %12 = arith.bitcast %11 : i16 to f16
      %13 = arith.extf %12 : f16 to f32
      %14 = arith.extsi %in_3 : i8 to i32
      %15 = arith.sitofp %14 : i32 to f32
      %16 = arith.mulf %13, %15 : f32
      linalg.yield %16 : f32
    } -> tensor<2x32x32xf32>
    %collapsed = tensor.collapse_shape %1 [[0, 1], [2]] : tensor<2x32x32xf32> into tensor<64x32xf32>
    %cst = arith.constant 0.000000e+00 : f32
    %2 = tensor.empty() : tensor<1x32xf32>
    %3 = linalg.fill ins(%cst : f32) outs(%2 : tensor<1x32xf32>) -> tensor<1x32xf32>
    %4 = linalg.generic {indexing_maps = [#map6, #map7, #map8], iterator_types = ["parallel", "reduction", "parallel"]} ins(%x, %collapsed : tensor<1x64xf32>, tensor<64x32xf32>) outs(%3 : tensor<1x32xf32>) {
    ^bb0(%in: f32, %in_2: f32, %out: f32):
      %7 = arith.mulf %in, %in_2 : f32
      %8 = arith.addf %out, %7 : f32
      linalg.yield %8 : f32
    } -> tensor<1x32xf32>
    %expanded_0 = tensor.expand_shape %w [[0], [1, 2]] output_shape [32, 2, 34] : tensor<32x68xi8> into tensor<32x2x34xi8>
    %5 = tensor.empty() : tensor<2x32x32xf32>
    %6 = linalg.generic {indexing_maps = [#map1, #map2, #map9, #map5], iterator_types = ["parallel", "parallel", "parallel"]} ins(%expanded_0, %expanded_0, %expanded_0 : tensor<32x2x34xi8>, tensor<32x2x34xi8>, tensor<32x2x34xi8>) outs(%5 : tensor<2x32x32xf32>) attrs =  {kina.dequantize = "Q8_0"} {
    ^bb0(%in: i8, %in_2: i8, %in_3: i8, %out: f32):
      %7 = arith.extui %in : i8 to i32
      %8 = arith.extui %in_2 : i8 to i32
      %c8_i32 = arith.constant 8 : i32
      %9 = arith.shli %8, %c8_i32 : i32
      %10 = arith.ori %7, %9 : i32
      %11 = arith.trunci %10 : i32 to i16
      %12 = arith.bitcast %11 : i16 to f16
      %13 = arith.extf %12 : f16 to f32
      %14 = arith.extsi %in_3 : i8 to i32
      %15 = arith.sitofp %14 : i32 to f32
      %16 = arith.mulf %13, %15 : f32
      linalg.yield %16 : f32
    } -> tensor<2x32x32xf32>
    %collapsed_1 = tensor.collapse_shape %6 [[0, 1], [2]] : tensor<2x32x32xf32> into tensor<64x32xf32>
    return %4, %collapsed_1 : tensor<1x32xf32>, tensor<64x32xf32>
  }
}
