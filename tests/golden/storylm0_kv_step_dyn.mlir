#loc = loc("examples/storylm0_kv_step_dyn.kina":4:5)
#loc10 = loc("examples/storylm0_kv_step_dyn.kina":18:16)
#loc12 = loc("examples/storylm0_kv_step_dyn.kina":19:16)
#loc13 = loc("examples/storylm0_kv_step_dyn.kina":20:15)
#loc14 = loc("examples/storylm0_kv_step_dyn.kina":21:17)
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3, d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map4 = affine_map<(d0, d1, d2, d3) -> (0, 0, d2, 0)>
#map5 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
module {
  func.func @kina_kv_step(%arg0: memref<?x?x1x?xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg1: memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg2: memref<?x?x?x1xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg3: memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg4: memref<?x?x1x?xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg5: memref<1x1x1x1xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg6: memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg7: memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5), %arg8: memref<?x?x1x?xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step_dyn.kina":4:5)) attributes {llvm.emit_c_interface} {
    %0 = bufferization.to_tensor %arg0 restrict : memref<?x?x1x?xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x1x?xf32> loc(#loc1)
    %c0 = arith.constant 0 : index loc(#loc1)
    %dim = tensor.dim %0, %c0 : tensor<?x?x1x?xf32> loc(#loc1)
    %c1 = arith.constant 1 : index loc(#loc1)
    %dim_0 = tensor.dim %0, %c1 : tensor<?x?x1x?xf32> loc(#loc1)
    %c3 = arith.constant 3 : index loc(#loc1)
    %dim_1 = tensor.dim %0, %c3 : tensor<?x?x1x?xf32> loc(#loc1)
    %1 = bufferization.to_tensor %arg1 restrict : memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x?x?xf32> loc(#loc2)
    %c3_2 = arith.constant 3 : index loc(#loc2)
    %dim_3 = tensor.dim %1, %c3_2 : tensor<?x?x?x?xf32> loc(#loc2)
    %2 = bufferization.to_tensor %arg2 restrict : memref<?x?x?x1xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x?x1xf32> loc(#loc3)
    %3 = bufferization.to_tensor %arg3 restrict : memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x?x?xf32> loc(#loc4)
    %4 = bufferization.to_tensor %arg4 restrict : memref<?x?x1x?xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x1x?xf32> loc(#loc5)
    %5 = bufferization.to_tensor %arg5 restrict : memref<1x1x1x1xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x1x1x1xf32> loc(#loc6)
    %6 = bufferization.to_tensor %arg6 restrict writable : memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x?x?xf32> loc(#loc7)
    %7 = bufferization.to_tensor %arg7 restrict writable : memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x?x?xf32> loc(#loc8)
    %8 = bufferization.to_tensor %arg8 restrict writable : memref<?x?x1x?xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<?x?x1x?xf32> loc(#loc9)
    %c1_4 = arith.constant 1 : index loc(#loc10)
    %9 = arith.addi %c1_4, %dim_3 : index loc(#loc10)
    %10 = tensor.empty(%dim, %dim_0, %9) : tensor<?x?x1x?xf32> loc(#loc10)
    %cst = arith.constant 0.000000e+00 : f32 loc(#loc10)
    %11 = linalg.fill ins(%cst : f32) outs(%10 : tensor<?x?x1x?xf32>) -> tensor<?x?x1x?xf32> loc(#loc10)
    %extracted_slice = tensor.extract_slice %6[0, 0, 0, 0] [%dim, %dim_0, %dim_1, %dim_3] [1, 1, 1, 1] : tensor<?x?x?x?xf32> to tensor<?x?x?x?xf32> loc(#loc11)
    %extracted_slice_5 = tensor.extract_slice %11[0, 0, 0, 0] [%dim, %dim_0, 1, %dim_3] [1, 1, 1, 1] : tensor<?x?x1x?xf32> to tensor<?x?x1x?xf32> loc(#loc10)
    %12:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%0, %1 : tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) outs(%extracted_slice_5, %extracted_slice : tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %in_20: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %out_21: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16)):
      %26 = arith.mulf %in, %in_20 : f32 loc(#loc10)
      %27 = arith.addf %out, %26 : f32 loc(#loc10)
      linalg.yield %27, %in_20 : f32, f32 loc(#loc10)
    } -> (tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) loc(#loc10)
    %inserted_slice = tensor.insert_slice %12#1 into %6[0, 0, 0, 0] [%dim, %dim_0, %dim_1, %dim_3] [1, 1, 1, 1] : tensor<?x?x?x?xf32> into tensor<?x?x?x?xf32> loc(#loc11)
    %inserted_slice_6 = tensor.insert_slice %12#0 into %11[0, 0, 0, 0] [%dim, %dim_0, 1, %dim_3] [1, 1, 1, 1] : tensor<?x?x1x?xf32> into tensor<?x?x1x?xf32> loc(#loc10)
    %extracted_slice_7 = tensor.extract_slice %inserted_slice[0, 0, 0, %dim_3] [%dim, %dim_0, %dim_1, 1] [1, 1, 1, 1] : tensor<?x?x?x?xf32> to tensor<?x?x?x1xf32> loc(#loc11)
    %extracted_slice_8 = tensor.extract_slice %inserted_slice_6[0, 0, 0, %dim_3] [%dim, %dim_0, 1, 1] [1, 1, 1, 1] : tensor<?x?x1x?xf32> to tensor<?x?x1x1xf32> loc(#loc10)
    %13:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%0, %2 : tensor<?x?x1x?xf32>, tensor<?x?x?x1xf32>) outs(%extracted_slice_8, %extracted_slice_7 : tensor<?x?x1x1xf32>, tensor<?x?x?x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %in_20: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %out_21: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16)):
      %26 = arith.mulf %in, %in_20 : f32 loc(#loc10)
      %27 = arith.addf %out, %26 : f32 loc(#loc10)
      linalg.yield %27, %in_20 : f32, f32 loc(#loc10)
    } -> (tensor<?x?x1x1xf32>, tensor<?x?x?x1xf32>) loc(#loc10)
    %inserted_slice_9 = tensor.insert_slice %13#1 into %inserted_slice[0, 0, 0, %dim_3] [%dim, %dim_0, %dim_1, 1] [1, 1, 1, 1] : tensor<?x?x?x1xf32> into tensor<?x?x?x?xf32> loc(#loc11)
    %inserted_slice_10 = tensor.insert_slice %13#0 into %inserted_slice_6[0, 0, 0, %dim_3] [%dim, %dim_0, 1, 1] [1, 1, 1, 1] : tensor<?x?x1x1xf32> into tensor<?x?x1x?xf32> loc(#loc10)
    %14 = linalg.generic {indexing_maps = [#map3, #map4, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%inserted_slice_10, %5 : tensor<?x?x1x?xf32>, tensor<1x1x1x1xf32>) outs(%inserted_slice_10 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":19:16), %in_20: f32 loc("examples/storylm0_kv_step_dyn.kina":19:16), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":19:16)):
      %26 = arith.mulf %in, %in_20 : f32 loc(#loc12)
      linalg.yield %26 : f32 loc(#loc12)
    } -> tensor<?x?x1x?xf32> loc(#loc12)
    %cst_11 = arith.constant 0xFF800000 : f32 loc(#loc13)
    %15 = tensor.empty(%dim, %dim_0) : tensor<?x?x1xf32> loc(#loc13)
    %16 = linalg.fill ins(%cst_11 : f32) outs(%15 : tensor<?x?x1xf32>) -> tensor<?x?x1xf32> loc(#loc13)
    %17 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%14 : tensor<?x?x1x?xf32>) outs(%16 : tensor<?x?x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %26 = arith.maximumf %in, %out : f32 loc(#loc13)
      linalg.yield %26 : f32 loc(#loc13)
    } -> tensor<?x?x1xf32> loc(#loc13)
    %18 = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%14, %17 : tensor<?x?x1x?xf32>, tensor<?x?x1xf32>) outs(%14 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %in_20: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %26 = arith.subf %in, %in_20 : f32 loc(#loc13)
      %27 = math.exp %26 : f32 loc(#loc13)
      linalg.yield %27 : f32 loc(#loc13)
    } -> tensor<?x?x1x?xf32> loc(#loc13)
    %cst_12 = arith.constant 0.000000e+00 : f32 loc(#loc13)
    %19 = tensor.empty(%dim, %dim_0) : tensor<?x?x1xf32> loc(#loc13)
    %20 = linalg.fill ins(%cst_12 : f32) outs(%19 : tensor<?x?x1xf32>) -> tensor<?x?x1xf32> loc(#loc13)
    %21 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%18 : tensor<?x?x1x?xf32>) outs(%20 : tensor<?x?x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %26 = arith.addf %in, %out : f32 loc(#loc13)
      linalg.yield %26 : f32 loc(#loc13)
    } -> tensor<?x?x1xf32> loc(#loc13)
    %22 = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%18, %21 : tensor<?x?x1x?xf32>, tensor<?x?x1xf32>) outs(%18 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %in_20: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %26 = arith.divf %in, %in_20 : f32 loc(#loc13)
      linalg.yield %26 : f32 loc(#loc13)
    } -> tensor<?x?x1x?xf32> loc(#loc13)
    %cst_13 = arith.constant 0.000000e+00 : f32 loc(#loc14)
    %23 = linalg.fill ins(%cst_13 : f32) outs(%8 : tensor<?x?x1x?xf32>) -> tensor<?x?x1x?xf32> loc(#loc14)
    %extracted_slice_14 = tensor.extract_slice %7[0, 0, 0, 0] [%dim, %dim_0, %dim_3, %dim_1] [1, 1, 1, 1] : tensor<?x?x?x?xf32> to tensor<?x?x?x?xf32> loc(#loc15)
    %extracted_slice_15 = tensor.extract_slice %22[0, 0, 0, 0] [%dim, %dim_0, 1, %dim_3] [1, 1, 1, 1] : tensor<?x?x1x?xf32> to tensor<?x?x1x?xf32> loc(#loc14)
    %24:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%extracted_slice_15, %3 : tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) outs(%23, %extracted_slice_14 : tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %in_20: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %out_21: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17)):
      %26 = arith.mulf %in, %in_20 : f32 loc(#loc14)
      %27 = arith.addf %out, %26 : f32 loc(#loc14)
      linalg.yield %27, %in_20 : f32, f32 loc(#loc14)
    } -> (tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) loc(#loc14)
    %inserted_slice_16 = tensor.insert_slice %24#1 into %7[0, 0, 0, 0] [%dim, %dim_0, %dim_3, %dim_1] [1, 1, 1, 1] : tensor<?x?x?x?xf32> into tensor<?x?x?x?xf32> loc(#loc15)
    %extracted_slice_17 = tensor.extract_slice %inserted_slice_16[0, 0, %dim_3, 0] [%dim, %dim_0, 1, %dim_1] [1, 1, 1, 1] : tensor<?x?x?x?xf32> to tensor<?x?x1x?xf32> loc(#loc15)
    %extracted_slice_18 = tensor.extract_slice %22[0, 0, 0, %dim_3] [%dim, %dim_0, 1, 1] [1, 1, 1, 1] : tensor<?x?x1x?xf32> to tensor<?x?x1x1xf32> loc(#loc14)
    %25:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%extracted_slice_18, %4 : tensor<?x?x1x1xf32>, tensor<?x?x1x?xf32>) outs(%24#0, %extracted_slice_17 : tensor<?x?x1x?xf32>, tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %in_20: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %out_21: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17)):
      %26 = arith.mulf %in, %in_20 : f32 loc(#loc14)
      %27 = arith.addf %out, %26 : f32 loc(#loc14)
      linalg.yield %27, %in_20 : f32, f32 loc(#loc14)
    } -> (tensor<?x?x1x?xf32>, tensor<?x?x1x?xf32>) loc(#loc14)
    %inserted_slice_19 = tensor.insert_slice %25#1 into %inserted_slice_16[0, 0, %dim_3, 0] [%dim, %dim_0, 1, %dim_1] [1, 1, 1, 1] : tensor<?x?x1x?xf32> into tensor<?x?x?x?xf32> loc(#loc15)
    bufferization.materialize_in_destination %inserted_slice_9 in restrict writable %arg6 : (tensor<?x?x?x?xf32>, memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>>) -> () loc(#loc7)
    bufferization.materialize_in_destination %inserted_slice_19 in restrict writable %arg7 : (tensor<?x?x?x?xf32>, memref<?x?x?x?xf32, strided<[?, ?, ?, 1], offset: ?>>) -> () loc(#loc8)
    bufferization.materialize_in_destination %25#0 in restrict writable %arg8 : (tensor<?x?x1x?xf32>, memref<?x?x1x?xf32, strided<[?, ?, ?, 1], offset: ?>>) -> () loc(#loc9)
    return loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc1 = loc("examples/storylm0_kv_step_dyn.kina":5:3)
#loc2 = loc("examples/storylm0_kv_step_dyn.kina":6:3)
#loc3 = loc("examples/storylm0_kv_step_dyn.kina":7:3)
#loc4 = loc("examples/storylm0_kv_step_dyn.kina":8:3)
#loc5 = loc("examples/storylm0_kv_step_dyn.kina":9:3)
#loc6 = loc("examples/storylm0_kv_step_dyn.kina":10:3)
#loc7 = loc("examples/storylm0_kv_step_dyn.kina":22:4)
#loc8 = loc("examples/storylm0_kv_step_dyn.kina":22:12)
#loc9 = loc("examples/storylm0_kv_step_dyn.kina":22:20)
#loc11 = loc("examples/storylm0_kv_step_dyn.kina":16:16)
#loc15 = loc("examples/storylm0_kv_step_dyn.kina":17:16)
