#loc1 = loc("examples/storylm0_kv_step_dyn.kina":5:3)
#loc2 = loc("examples/storylm0_kv_step_dyn.kina":6:3)
#loc3 = loc("examples/storylm0_kv_step_dyn.kina":7:3)
#loc4 = loc("examples/storylm0_kv_step_dyn.kina":8:3)
#loc5 = loc("examples/storylm0_kv_step_dyn.kina":9:3)
#loc6 = loc("examples/storylm0_kv_step_dyn.kina":10:3)
#loc13 = loc("examples/storylm0_kv_step_dyn.kina":18:16)
#loc14 = loc("examples/storylm0_kv_step_dyn.kina":19:16)
#loc15 = loc("examples/storylm0_kv_step_dyn.kina":20:15)
#loc16 = loc("examples/storylm0_kv_step_dyn.kina":21:17)
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3, d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#map4 = affine_map<(d0, d1, d2, d3) -> (0, 0, d2, 0)>
#map5 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
#loc17 = loc("q_new"(#loc1))
#loc18 = loc("k_past"(#loc2))
#loc19 = loc("k_new"(#loc3))
#loc20 = loc("v_past"(#loc4))
#loc21 = loc("v_new"(#loc5))
#loc22 = loc("scale"(#loc6))
module {
  func.func @kv_step(%q_new: tensor<?x?x1x?xf32> loc("q_new"(#loc1)), %k_past: tensor<?x?x?x?xf32> loc("k_past"(#loc2)), %k_new: tensor<?x?x?x1xf32> loc("k_new"(#loc3)), %v_past: tensor<?x?x?x?xf32> loc("v_past"(#loc4)), %v_new: tensor<?x?x1x?xf32> loc("v_new"(#loc5)), %scale: tensor<1x1x1x1xf32> loc("scale"(#loc6))) -> (tensor<?x?x?x?xf32>, tensor<?x?x?x?xf32>, tensor<?x?x1x?xf32>) {
    %c0 = arith.constant 0 : index loc(#loc7)
    %B = tensor.dim %q_new, %c0 : tensor<?x?x1x?xf32> loc(#loc23)
    %c1 = arith.constant 1 : index loc(#loc8)
    %H = tensor.dim %q_new, %c1 : tensor<?x?x1x?xf32> loc(#loc24)
    %c3 = arith.constant 3 : index loc(#loc9)
    %Dh = tensor.dim %q_new, %c3 : tensor<?x?x1x?xf32> loc(#loc25)
    %c3_0 = arith.constant 3 : index loc(#loc10)
    %S = tensor.dim %k_past, %c3_0 : tensor<?x?x?x?xf32> loc(#loc26)
    %c1_1 = arith.constant 1 : index loc(#loc11)
    %0 = arith.addi %c1_1, %S : index loc(#loc11)
    %1 = tensor.empty(%B, %H, %Dh, %0) : tensor<?x?x?x?xf32> loc(#loc11)
    %inserted_slice = tensor.insert_slice %k_past into %1[0, 0, 0, 0] [%B, %H, %Dh, %S] [1, 1, 1, 1] : tensor<?x?x?x?xf32> into tensor<?x?x?x?xf32> loc(#loc11)
    %k_next = tensor.insert_slice %k_new into %inserted_slice[0, 0, 0, %S] [%B, %H, %Dh, 1] [1, 1, 1, 1] : tensor<?x?x?x1xf32> into tensor<?x?x?x?xf32> loc(#loc27)
    %2 = tensor.empty(%B, %H, %0, %Dh) : tensor<?x?x?x?xf32> loc(#loc12)
    %inserted_slice_2 = tensor.insert_slice %v_past into %2[0, 0, 0, 0] [%B, %H, %S, %Dh] [1, 1, 1, 1] : tensor<?x?x?x?xf32> into tensor<?x?x?x?xf32> loc(#loc12)
    %v_next = tensor.insert_slice %v_new into %inserted_slice_2[0, 0, %S, 0] [%B, %H, 1, %Dh] [1, 1, 1, 1] : tensor<?x?x1x?xf32> into tensor<?x?x?x?xf32> loc(#loc28)
    %cst = arith.constant 0.000000e+00 : f32 loc(#loc13)
    %3 = tensor.empty(%B, %H, %0) : tensor<?x?x1x?xf32> loc(#loc13)
    %4 = linalg.fill ins(%cst : f32) outs(%3 : tensor<?x?x1x?xf32>) -> tensor<?x?x1x?xf32> loc(#loc13)
    %scores = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%q_new, %k_next : tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) outs(%4 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %in_6: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":18:16)):
      %17 = arith.mulf %in, %in_6 : f32 loc(#loc13)
      %18 = arith.addf %out, %17 : f32 loc(#loc13)
      linalg.yield %18 : f32 loc(#loc13)
    } -> tensor<?x?x1x?xf32> loc(#loc29)
    %5 = tensor.empty(%B, %H, %0) : tensor<?x?x1x?xf32> loc(#loc14)
    %scaled = linalg.generic {indexing_maps = [#map3, #map4, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%scores, %scale : tensor<?x?x1x?xf32>, tensor<1x1x1x1xf32>) outs(%5 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":19:16), %in_6: f32 loc("examples/storylm0_kv_step_dyn.kina":19:16), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":19:16)):
      %17 = arith.mulf %in, %in_6 : f32 loc(#loc14)
      linalg.yield %17 : f32 loc(#loc14)
    } -> tensor<?x?x1x?xf32> loc(#loc30)
    %cst_3 = arith.constant 0xFF800000 : f32 loc(#loc15)
    %6 = tensor.empty(%B, %H) : tensor<?x?x1xf32> loc(#loc15)
    %7 = linalg.fill ins(%cst_3 : f32) outs(%6 : tensor<?x?x1xf32>) -> tensor<?x?x1xf32> loc(#loc15)
    %8 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%scaled : tensor<?x?x1x?xf32>) outs(%7 : tensor<?x?x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %17 = arith.maximumf %in, %out : f32 loc(#loc15)
      linalg.yield %17 : f32 loc(#loc15)
    } -> tensor<?x?x1xf32> loc(#loc15)
    %9 = tensor.empty(%B, %H, %0) : tensor<?x?x1x?xf32> loc(#loc15)
    %10 = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%scaled, %8 : tensor<?x?x1x?xf32>, tensor<?x?x1xf32>) outs(%9 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %in_6: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %17 = arith.subf %in, %in_6 : f32 loc(#loc15)
      %18 = math.exp %17 : f32 loc(#loc15)
      linalg.yield %18 : f32 loc(#loc15)
    } -> tensor<?x?x1x?xf32> loc(#loc15)
    %cst_4 = arith.constant 0.000000e+00 : f32 loc(#loc15)
    %11 = tensor.empty(%B, %H) : tensor<?x?x1xf32> loc(#loc15)
    %12 = linalg.fill ins(%cst_4 : f32) outs(%11 : tensor<?x?x1xf32>) -> tensor<?x?x1xf32> loc(#loc15)
    %13 = linalg.generic {indexing_maps = [#map3, #map5], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%10 : tensor<?x?x1x?xf32>) outs(%12 : tensor<?x?x1xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %17 = arith.addf %in, %out : f32 loc(#loc15)
      linalg.yield %17 : f32 loc(#loc15)
    } -> tensor<?x?x1xf32> loc(#loc15)
    %14 = tensor.empty(%B, %H, %0) : tensor<?x?x1x?xf32> loc(#loc15)
    %probs = linalg.generic {indexing_maps = [#map3, #map5, #map3], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%10, %13 : tensor<?x?x1x?xf32>, tensor<?x?x1xf32>) outs(%14 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %in_6: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":20:15)):
      %17 = arith.divf %in, %in_6 : f32 loc(#loc15)
      linalg.yield %17 : f32 loc(#loc15)
    } -> tensor<?x?x1x?xf32> loc(#loc31)
    %cst_5 = arith.constant 0.000000e+00 : f32 loc(#loc16)
    %15 = tensor.empty(%B, %H, %Dh) : tensor<?x?x1x?xf32> loc(#loc16)
    %16 = linalg.fill ins(%cst_5 : f32) outs(%15 : tensor<?x?x1x?xf32>) -> tensor<?x?x1x?xf32> loc(#loc16)
    %context = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%probs, %v_next : tensor<?x?x1x?xf32>, tensor<?x?x?x?xf32>) outs(%16 : tensor<?x?x1x?xf32>) {
    ^bb0(%in: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %in_6: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17), %out: f32 loc("examples/storylm0_kv_step_dyn.kina":21:17)):
      %17 = arith.mulf %in, %in_6 : f32 loc(#loc16)
      %18 = arith.addf %out, %17 : f32 loc(#loc16)
      linalg.yield %18 : f32 loc(#loc16)
    } -> tensor<?x?x1x?xf32> loc(#loc32)
    return %k_next, %v_next, %context : tensor<?x?x?x?xf32>, tensor<?x?x?x?xf32>, tensor<?x?x1x?xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc = loc("examples/storylm0_kv_step_dyn.kina":4:5)
#loc7 = loc("examples/storylm0_kv_step_dyn.kina":5:23)
#loc8 = loc("examples/storylm0_kv_step_dyn.kina":5:26)
#loc9 = loc("examples/storylm0_kv_step_dyn.kina":5:32)
#loc10 = loc("examples/storylm0_kv_step_dyn.kina":6:34)
#loc11 = loc("examples/storylm0_kv_step_dyn.kina":16:16)
#loc12 = loc("examples/storylm0_kv_step_dyn.kina":17:16)
#loc23 = loc("B"(#loc7))
#loc24 = loc("H"(#loc8))
#loc25 = loc("Dh"(#loc9))
#loc26 = loc("S"(#loc10))
#loc27 = loc("k_next"(#loc11))
#loc28 = loc("v_next"(#loc12))
#loc29 = loc("scores"(#loc13))
#loc30 = loc("scaled"(#loc14))
#loc31 = loc("probs"(#loc15))
#loc32 = loc("context"(#loc16))
