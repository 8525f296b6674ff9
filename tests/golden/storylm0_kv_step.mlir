#loc = loc("examples/storylm0_kv_step.kina":4:5)
#loc10 = loc("examples/storylm0_kv_step.kina":18:16)
#loc12 = loc("examples/storylm0_kv_step.kina":19:16)
#loc13 = loc("examples/storylm0_kv_step.kina":20:15)
#loc14 = loc("examples/storylm0_kv_step.kina":21:17)
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3, d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map4 = affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, 0)>
#map5 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
module {
  func.func @kina_kv_step(%arg0: memref<1x2x1x2xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg1: memref<1x2x2x3xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg2: memref<1x2x2x1xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg3: memref<1x2x3x2xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg4: memref<1x2x1x2xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg5: memref<1x1x1x1xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg6: memref<1x2x2x4xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg7: memref<1x2x4x2xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5), %arg8: memref<1x2x1x2xf32, strided<[?, ?, ?, 1], offset: ?>> loc("examples/storylm0_kv_step.kina":4:5)) attributes {llvm.emit_c_interface} {
    %0 = bufferization.to_tensor %arg0 restrict : memref<1x2x1x2xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x1x2xf32> loc(#loc1)
    %1 = bufferization.to_tensor %arg1 restrict : memref<1x2x2x3xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x2x3xf32> loc(#loc2)
    %2 = bufferization.to_tensor %arg2 restrict : memref<1x2x2x1xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x2x1xf32> loc(#loc3)
    %3 = bufferization.to_tensor %arg3 restrict : memref<1x2x3x2xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x3x2xf32> loc(#loc4)
    %4 = bufferization.to_tensor %arg4 restrict : memref<1x2x1x2xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x1x2xf32> loc(#loc5)
    %5 = bufferization.to_tensor %arg5 restrict : memref<1x1x1x1xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x1x1x1xf32> loc(#loc6)
    %6 = bufferization.to_tensor %arg6 restrict writable : memref<1x2x2x4xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x2x4xf32> loc(#loc7)
    %7 = bufferization.to_tensor %arg7 restrict writable : memref<1x2x4x2xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x4x2xf32> loc(#loc8)
    %8 = bufferization.to_tensor %arg8 restrict writable : memref<1x2x1x2xf32, strided<[?, ?, ?, 1], offset: ?>> to tensor<1x2x1x2xf32> loc(#loc9)
    %9 = tensor.empty() : tensor<1x2x1x4xf32> loc(#loc10)
    %cst = arith.constant 0.000000e+00 : f32 loc(#loc10)
    %10 = linalg.fill ins(%cst : f32) outs(%9 : tensor<1x2x1x4xf32>) -> tensor<1x2x1x4xf32> loc(#loc10)
    %extracted_slice = tensor.extract_slice %6[0, 0, 0, 0] [1, 2, 2, 3] [1, 1, 1, 1] : tensor<1x2x2x4xf32> to tensor<1x2x2x3xf32> loc(#loc11)
    %extracted_slice_0 = tensor.extract_slice %10[0, 0, 0, 0] [1, 2, 1, 3] [1, 1, 1, 1] : tensor<1x2x1x4xf32> to tensor<1x2x1x3xf32> loc(#loc10)
    %11:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%0, %1 : tensor<1x2x1x2xf32>, tensor<1x2x2x3xf32>) outs(%extracted_slice_0, %extracted_slice : tensor<1x2x1x3xf32>, tensor<1x2x2x3xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":18:16), %in_15: f32 loc("examples/storylm0_kv_step.kina":18:16), %out: f32 loc("examples/storylm0_kv_step.kina":18:16), %out_16: f32 loc("examples/storylm0_kv_step.kina":18:16)):
      %25 = arith.mulf %in, %in_15 : f32 loc(#loc10)
      %26 = arith.addf %out, %25 : f32 loc(#loc10)
      linalg.yield %26, %in_15 : f32, f32 loc(#loc10)
    } -> (tensor<1x2x1x3xf32>, tensor<1x2x2x3xf32>) loc(#loc10)
    %inserted_slice = tensor.insert_slice %11#1 into %6[0, 0, 0, 0] [1, 2, 2, 3] [1, 1, 1, 1] : tensor<1x2x2x3xf32> into tensor<1x2x2x4xf32> loc(#loc11)
    %inserted_slice_1 = tensor.insert_slice %11#0 into %10[0, 0, 0, 0] [1, 2, 1, 3] [1, 1, 1, 1] : tensor<1x2x1x3xf32> into tensor<1x2x1x4xf32> loc(#loc10)
    %extracted_slice_2 = tensor.extract_slice %inserted_slice[0, 0, 0, 3] [1, 2, 2, 1] [1, 1, 1, 1] : tensor<1x2x2x4xf32> to tensor<1x2x2x1xf32> loc(#loc11)
    %extracted_slice_3 = tensor.extract_slice %inserted_slice_1[0, 0, 0, 3] [1, 2, 1, 1] [1, 1, 1, 1] : tensor<1x2x1x4xf32> to tensor<1x2x1x1xf32> loc(#loc10)
    %12:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%0, %2 : tensor<1x2x1x2xf32>, tensor<1x2x2x1xf32>) outs(%extracted_slice_3, %extracted_slice_2 : tensor<1x2x1x1xf32>, tensor<1x2x2x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":18:16), %in_15: f32 loc("examples/storylm0_kv_step.kina":18:16), %out: f32 loc("examples/storylm0_kv_step.kina":18:16), %out_16: f32 loc("examples/storylm0_kv_step.kina":18:16)):
      %25 = arith.mulf %in, %in_15 : f32 loc(#loc10)
      %26 = arith.addf %out, %25 : f32 loc(#loc10)
      linalg.yield %26, %in_15 : f32, f32 loc(#loc10)
    } -> (tensor<1x2x1x1xf32>, tensor<1x2x2x1xf32>) loc(#loc10)
    %inserted_slice_4 = tensor.insert_slice %12#1 into %inserted_slice[0, 0, 0, 3] [1, 2, 2, 1] [1, 1, 1, 1] : tensor<1x2x2x1xf32> into tensor<1x2x2x4xf32> loc(#loc11)
    %inserted_slice_5 = tensor.insert_slice %12#0 into %inserted_slice_1[0, 0, 0, 3] [1, 2, 1, 1] [1, 1, 1, 1] : tensor<1x2x1x1xf32> into tensor<1x2x1x4xf32> loc(#loc10)
    %13 = linalg.generic {indexing_maps = [#map3, #map4, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%inserted_slice_5, %5 : tensor<1x2x1x4xf32>, tensor<1x1x1x1xf32>) outs(%inserted_slice_5 : tensor<1x2x1x4xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":19:16), %in_15: f32 loc("examples/storylm0_kv_step.kina":19:16), %out: f32 loc("examples/storylm0_kv_step.kina":19:16)):
      %25 = arith.mulf %in, %in_15 : f32 loc(#loc12)
      linalg.yield %25 : f32 loc(#loc12)
    } -> tensor<1x2x1x4xf32> loc(#loc12)
    %cst_6 = arith.constant 0xFF800000 : f32 loc(#loc13)
    %14 = tensor.empty() : tensor<1x2x1xf32> loc(#loc13)
    %15 = linalg.fill ins(%cst_6 : f32) outs(%14 : tensor<1x2x1xf32>) -> tensor<1x2x1xf32> loc(#loc13)
    %16 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%13 : tensor<1x2x1x4xf32>) outs(%15 : tensor<1x2x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %25 = arith.maximumf %in, %out : f32 loc(#loc13)
      linalg.yield %25 : f32 loc(#loc13)
    } -> tensor<1x2x1xf32> loc(#loc13)
    %17 = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%13, %16 : tensor<1x2x1x4xf32>, tensor<1x2x1xf32>) outs(%13 : tensor<1x2x1x4xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %in_15: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %25 = arith.subf %in, %in_15 : f32 loc(#loc13)
      %26 = math.exp %25 : f32 loc(#loc13)
      linalg.yield %26 : f32 loc(#loc13)
    } -> tensor<1x2x1x4xf32> loc(#loc13)
    %cst_7 = arith.constant 0.000000e+00 : f32 loc(#loc13)
    %18 = tensor.empty() : tensor<1x2x1xf32> loc(#loc13)
    %19 = linalg.fill ins(%cst_7 : f32) outs(%18 : tensor<1x2x1xf32>) -> tensor<1x2x1xf32> loc(#loc13)
    %20 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%17 : tensor<1x2x1x4xf32>) outs(%19 : tensor<1x2x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %25 = arith.addf %in, %out : f32 loc(#loc13)
      linalg.yield %25 : f32 loc(#loc13)
    } -> tensor<1x2x1xf32> loc(#loc13)
    %21 = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%17, %20 : tensor<1x2x1x4xf32>, tensor<1x2x1xf32>) outs(%17 : tensor<1x2x1x4xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %in_15: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %25 = arith.divf %in, %in_15 : f32 loc(#loc13)
      linalg.yield %25 : f32 loc(#loc13)
    } -> tensor<1x2x1x4xf32> loc(#loc13)
    %cst_8 = arith.constant 0.000000e+00 : f32 loc(#loc14)
    %22 = linalg.fill ins(%cst_8 : f32) outs(%8 : tensor<1x2x1x2xf32>) -> tensor<1x2x1x2xf32> loc(#loc14)
    %extracted_slice_9 = tensor.extract_slice %7[0, 0, 0, 0] [1, 2, 3, 2] [1, 1, 1, 1] : tensor<1x2x4x2xf32> to tensor<1x2x3x2xf32> loc(#loc15)
    %extracted_slice_10 = tensor.extract_slice %21[0, 0, 0, 0] [1, 2, 1, 3] [1, 1, 1, 1] : tensor<1x2x1x4xf32> to tensor<1x2x1x3xf32> loc(#loc14)
    %23:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%extracted_slice_10, %3 : tensor<1x2x1x3xf32>, tensor<1x2x3x2xf32>) outs(%22, %extracted_slice_9 : tensor<1x2x1x2xf32>, tensor<1x2x3x2xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":21:17), %in_15: f32 loc("examples/storylm0_kv_step.kina":21:17), %out: f32 loc("examples/storylm0_kv_step.kina":21:17), %out_16: f32 loc("examples/storylm0_kv_step.kina":21:17)):
      %25 = arith.mulf %in, %in_15 : f32 loc(#loc14)
      %26 = arith.addf %out, %25 : f32 loc(#loc14)
      linalg.yield %26, %in_15 : f32, f32 loc(#loc14)
    } -> (tensor<1x2x1x2xf32>, tensor<1x2x3x2xf32>) loc(#loc14)
    %inserted_slice_11 = tensor.insert_slice %23#1 into %7[0, 0, 0, 0] [1, 2, 3, 2] [1, 1, 1, 1] : tensor<1x2x3x2xf32> into tensor<1x2x4x2xf32> loc(#loc15)
    %extracted_slice_12 = tensor.extract_slice %inserted_slice_11[0, 0, 3, 0] [1, 2, 1, 2] [1, 1, 1, 1] : tensor<1x2x4x2xf32> to tensor<1x2x1x2xf32> loc(#loc15)
    %extracted_slice_13 = tensor.extract_slice %21[0, 0, 0, 3] [1, 2, 1, 1] [1, 1, 1, 1] : tensor<1x2x1x4xf32> to tensor<1x2x1x1xf32> loc(#loc14)
    %24:2 = linalg.generic {indexing_maps = [#map, #map1, #map2, #map1], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%extracted_slice_13, %4 : tensor<1x2x1x1xf32>, tensor<1x2x1x2xf32>) outs(%23#0, %extracted_slice_12 : tensor<1x2x1x2xf32>, tensor<1x2x1x2xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":21:17), %in_15: f32 loc("examples/storylm0_kv_step.kina":21:17), %out: f32 loc("examples/storylm0_kv_step.kina":21:17), %out_16: f32 loc("examples/storylm0_kv_step.kina":21:17)):
      %25 = arith.mulf %in, %in_15 : f32 loc(#loc14)
      %26 = arith.addf %out, %25 : f32 loc(#loc14)
      linalg.yield %26, %in_15 : f32, f32 loc(#loc14)
    } -> (tensor<1x2x1x2xf32>, tensor<1x2x1x2xf32>) loc(#loc14)
    %inserted_slice_14 = tensor.insert_slice %24#1 into %inserted_slice_11[0, 0, 3, 0] [1, 2, 1, 2] [1, 1, 1, 1] : tensor<1x2x1x2xf32> into tensor<1x2x4x2xf32> loc(#loc15)
    bufferization.materialize_in_destination %inserted_slice_4 in restrict writable %arg6 : (tensor<1x2x2x4xf32>, memref<1x2x2x4xf32, strided<[?, ?, ?, 1], offset: ?>>) -> () loc(#loc7)
    bufferization.materialize_in_destination %inserted_slice_14 in restrict writable %arg7 : (tensor<1x2x4x2xf32>, memref<1x2x4x2xf32, strided<[?, ?, ?, 1], offset: ?>>) -> () loc(#loc8)
    bufferization.materialize_in_destination %24#0 in restrict writable %arg8 : (tensor<1x2x1x2xf32>, memref<1x2x1x2xf32, strided<[?, ?, ?, 1], offset: ?>>) -> () loc(#loc9)
    return loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc1 = loc("examples/storylm0_kv_step.kina":5:3)
#loc2 = loc("examples/storylm0_kv_step.kina":6:3)
#loc3 = loc("examples/storylm0_kv_step.kina":7:3)
#loc4 = loc("examples/storylm0_kv_step.kina":8:3)
#loc5 = loc("examples/storylm0_kv_step.kina":9:3)
#loc6 = loc("examples/storylm0_kv_step.kina":10:3)
#loc7 = loc("examples/storylm0_kv_step.kina":22:4)
#loc8 = loc("examples/storylm0_kv_step.kina":22:12)
#loc9 = loc("examples/storylm0_kv_step.kina":22:20)
#loc11 = loc("examples/storylm0_kv_step.kina":16:16)
#loc15 = loc("examples/storylm0_kv_step.kina":17:16)
