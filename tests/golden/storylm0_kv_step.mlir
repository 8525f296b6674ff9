#loc1 = loc("examples/storylm0_kv_step.kina":5:3)
#loc2 = loc("examples/storylm0_kv_step.kina":6:3)
#loc3 = loc("examples/storylm0_kv_step.kina":7:3)
#loc4 = loc("examples/storylm0_kv_step.kina":8:3)
#loc5 = loc("examples/storylm0_kv_step.kina":9:3)
#loc6 = loc("examples/storylm0_kv_step.kina":10:3)
#loc9 = loc("examples/storylm0_kv_step.kina":18:16)
#loc10 = loc("examples/storylm0_kv_step.kina":19:16)
#loc11 = loc("examples/storylm0_kv_step.kina":20:15)
#loc12 = loc("examples/storylm0_kv_step.kina":21:17)
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3, d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map4 = affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, 0)>
#map5 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
#loc13 = loc("q_new"(#loc1))
#loc14 = loc("k_past"(#loc2))
#loc15 = loc("k_new"(#loc3))
#loc16 = loc("v_past"(#loc4))
#loc17 = loc("v_new"(#loc5))
#loc18 = loc("scale"(#loc6))
module {
  func.func @kv_step(%q_new: tensor<1x2x1x2xf32> loc("q_new"(#loc1)), %k_past: tensor<1x2x2x3xf32> loc("k_past"(#loc2)), %k_new: tensor<1x2x2x1xf32> loc("k_new"(#loc3)), %v_past: tensor<1x2x3x2xf32> loc("v_past"(#loc4)), %v_new: tensor<1x2x1x2xf32> loc("v_new"(#loc5)), %scale: tensor<1x1x1x1xf32> loc("scale"(#loc6))) -> (tensor<1x2x2x4xf32>, tensor<1x2x4x2xf32>, tensor<1x2x1x2xf32>) {
    %0 = tensor.empty() : tensor<1x2x2x4xf32> loc(#loc7)
    %inserted_slice = tensor.insert_slice %k_past into %0[0, 0, 0, 0] [1, 2, 2, 3] [1, 1, 1, 1] : tensor<1x2x2x3xf32> into tensor<1x2x2x4xf32> loc(#loc7)
    %k_next = tensor.insert_slice %k_new into %inserted_slice[0, 0, 0, 3] [1, 2, 2, 1] [1, 1, 1, 1] : tensor<1x2x2x1xf32> into tensor<1x2x2x4xf32> loc(#loc19)
    %1 = tensor.empty() : tensor<1x2x4x2xf32> loc(#loc8)
    %inserted_slice_0 = tensor.insert_slice %v_past into %1[0, 0, 0, 0] [1, 2, 3, 2] [1, 1, 1, 1] : tensor<1x2x3x2xf32> into tensor<1x2x4x2xf32> loc(#loc8)
    %v_next = tensor.insert_slice %v_new into %inserted_slice_0[0, 0, 3, 0] [1, 2, 1, 2] [1, 1, 1, 1] : tensor<1x2x1x2xf32> into tensor<1x2x4x2xf32> loc(#loc20)
    %cst = arith.constant 0.000000e+00 : f32 loc(#loc9)
    %2 = tensor.empty() : tensor<1x2x1x4xf32> loc(#loc9)
    %3 = linalg.fill ins(%cst : f32) outs(%2 : tensor<1x2x1x4xf32>) -> tensor<1x2x1x4xf32> loc(#loc9)
    %scores = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%q_new, %k_next : tensor<1x2x1x2xf32>, tensor<1x2x2x4xf32>) outs(%3 : tensor<1x2x1x4xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":18:16), %in_4: f32 loc("examples/storylm0_kv_step.kina":18:16), %out: f32 loc("examples/storylm0_kv_step.kina":18:16)):
      %16 = arith.mulf %in, %in_4 : f32 loc(#loc9)
      %17 = arith.addf %out, %16 : f32 loc(#loc9)
      linalg.yield %17 : f32 loc(#loc9)
    } -> tensor<1x2x1x4xf32> loc(#loc21)
    %4 = tensor.empty() : tensor<1x2x1x4xf32> loc(#loc10)
    %scaled = linalg.generic {indexing_maps = [#map3, #map4, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%scores, %scale : tensor<1x2x1x4xf32>, tensor<1x1x1x1xf32>) outs(%4 : tensor<1x2x1x4xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":19:16), %in_4: f32 loc("examples/storylm0_kv_step.kina":19:16), %out: f32 loc("examples/storylm0_kv_step.kina":19:16)):
      %16 = arith.mulf %in, %in_4 : f32 loc(#loc10)
      linalg.yield %16 : f32 loc(#loc10)
    } -> tensor<1x2x1x4xf32> loc(#loc22)
    %cst_1 = arith.constant 0xFF800000 : f32 loc(#loc11)
    %5 = tensor.empty() : tensor<1x2x1xf32> loc(#loc11)
    %6 = linalg.fill ins(%cst_1 : f32) outs(%5 : tensor<1x2x1xf32>) -> tensor<1x2x1xf32> loc(#loc11)
    %7 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%scaled : tensor<1x2x1x4xf32>) outs(%6 : tensor<1x2x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %16 = arith.maximumf %in, %out : f32 loc(#loc11)
      linalg.yield %16 : f32 loc(#loc11)
    } -> tensor<1x2x1xf32> loc(#loc11)
    %8 = tensor.empty() : tensor<1x2x1x4xf32> loc(#loc11)
    %9 = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%scaled, %7 : tensor<1x2x1x4xf32>, tensor<1x2x1xf32>) outs(%8 : tensor<1x2x1x4xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %in_4: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %16 = arith.subf %in, %in_4 : f32 loc(#loc11)
      %17 = math.exp %16 : f32 loc(#loc11)
      linalg.yield %17 : f32 loc(#loc11)
    } -> tensor<1x2x1x4xf32> loc(#loc11)
    %cst_2 = arith.constant 0.000000e+00 : f32 loc(#loc11)
    %10 = tensor.empty() : tensor<1x2x1xf32> loc(#loc11)
    %11 = linalg.fill ins(%cst_2 : f32) outs(%10 : tensor<1x2x1xf32>) -> tensor<1x2x1xf32> loc(#loc11)
    %12 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%9 : tensor<1x2x1x4xf32>) outs(%11 : tensor<1x2x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %16 = arith.addf %in, %out : f32 loc(#loc11)
      linalg.yield %16 : f32 loc(#loc11)
    } -> tensor<1x2x1xf32> loc(#loc11)
    %13 = tensor.empty() : tensor<1x2x1x4xf32> loc(#loc11)
    %probs = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%9, %12 : tensor<1x2x1x4xf32>, tensor<1x2x1xf32>) outs(%13 : tensor<1x2x1x4xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":20:15), %in_4: f32 loc("examples/storylm0_kv_step.kina":20:15), %out: f32 loc("examples/storylm0_kv_step.kina":20:15)):
      %16 = arith.divf %in, %in_4 : f32 loc(#loc11)
      linalg.yield %16 : f32 loc(#loc11)
    } -> tensor<1x2x1x4xf32> loc(#loc23)
    %cst_3 = arith.constant 0.000000e+00 : f32 loc(#loc12)
    %14 = tensor.empty() : tensor<1x2x1x2xf32> loc(#loc12)
    %15 = linalg.fill ins(%cst_3 : f32) outs(%14 : tensor<1x2x1x2xf32>) -> tensor<1x2x1x2xf32> loc(#loc12)
    %context = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%probs, %v_next : tensor<1x2x1x4xf32>, tensor<1x2x4x2xf32>) outs(%15 : tensor<1x2x1x2xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step.kina":21:17), %in_4: f32 loc("examples/storylm0_kv_step.kina":21:17), %out: f32 loc("examples/storylm0_kv_step.kina":21:17)):
      %16 = arith.mulf %in, %in_4 : f32 loc(#loc12)
      %17 = arith.addf %out, %16 : f32 loc(#loc12)
      linalg.yield %17 : f32 loc(#loc12)
    } -> tensor<1x2x1x2xf32> loc(#loc24)
    return %k_next, %v_next, %context : tensor<1x2x2x4xf32>, tensor<1x2x4x2xf32>, tensor<1x2x1x2xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc = loc("examples/storylm0_kv_step.kina":4:5)
#loc7 = loc("examples/storylm0_kv_step.kina":16:16)
#loc8 = loc("examples/storylm0_kv_step.kina":17:16)
#loc19 = loc("k_next"(#loc7))
#loc20 = loc("v_next"(#loc8))
#loc21 = loc("scores"(#loc9))
#loc22 = loc("scaled"(#loc10))
#loc23 = loc("probs"(#loc11))
#loc24 = loc("context"(#loc12))
