// RUN: kinac opt %s --passes fuse-concat-matmul | FileCheck %s

// A one-row matmul reading a concat splits into one two-result generic per concat
// operand: it reads the operand once, yields its product and its copy, and the
// copy lands in the operand's slot of the concat.

#lhs = affine_map<(i, k, j) -> (i, k)>
#rhs = affine_map<(i, k, j) -> (k, j)>
#out = affine_map<(i, k, j) -> (i, j)>
#lhs3 = affine_map<(b, i, k, j) -> (b, i, k)>
#rhs3 = affine_map<(b, i, k, j) -> (b, k, j)>
#out3 = affine_map<(b, i, k, j) -> (b, i, j)>

// Along the column axis: each part gives its own columns of the product.
// CHECK-LABEL: func.func @columns(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<1x4xf32>, %[[A:[^:]+]]: tensor<4x2xf32>, %[[B:[^:]+]]: tensor<4x1xf32>)
// CHECK:         %[[E:.+]] = tensor.empty() : tensor<4x3xf32>
// CHECK:         %[[ACC:.+]] = linalg.fill
// CHECK:         %[[SLOT0:.+]] = tensor.extract_slice %[[E]][0, 0] [4, 2] [1, 1]
// CHECK:         %[[ACC0:.+]] = tensor.extract_slice %[[ACC]][0, 0] [1, 2] [1, 1]
// CHECK:         %[[P0:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q]], %[[A]] : tensor<1x4xf32>, tensor<4x2xf32>) outs(%[[ACC0]], %[[SLOT0]] : tensor<1x2xf32>, tensor<4x2xf32>)
// CHECK-NEXT:    ^bb0(%[[X:[^:]+]]: f32, %[[Y:[^:]+]]: f32, %[[S:[^:]+]]: f32, %{{.+}}: f32):
// CHECK-NEXT:      %[[M:.+]] = arith.mulf %[[X]], %[[Y]] : f32
// CHECK-NEXT:      %[[R:.+]] = arith.addf %[[S]], %[[M]] : f32
// CHECK-NEXT:      linalg.yield %[[R]], %[[Y]] : f32, f32
// CHECK:         %[[C0:.+]] = tensor.insert_slice %[[P0]]#1 into %[[E]][0, 0] [4, 2] [1, 1]
// CHECK:         %[[MM0:.+]] = tensor.insert_slice %[[P0]]#0 into %[[ACC]][0, 0] [1, 2] [1, 1]
// CHECK:         %[[SLOT1:.+]] = tensor.extract_slice %[[C0]][0, 2] [4, 1] [1, 1]
// CHECK:         %[[ACC1:.+]] = tensor.extract_slice %[[MM0]][0, 2] [1, 1] [1, 1]
// CHECK:         %[[P1:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q]], %[[B]] : tensor<1x4xf32>, tensor<4x1xf32>) outs(%[[ACC1]], %[[SLOT1]] : tensor<1x1xf32>, tensor<4x1xf32>)
// CHECK:         %[[C:.+]] = tensor.insert_slice %[[P1]]#1 into %[[C0]][0, 2] [4, 1] [1, 1]
// CHECK:         %[[MM:.+]] = tensor.insert_slice %[[P1]]#0 into %[[MM0]][0, 2] [1, 1] [1, 1]
// CHECK:         return %[[C]], %[[MM]] : tensor<4x3xf32>, tensor<1x3xf32>
func.func @columns(%q: tensor<1x4xf32>, %a: tensor<4x2xf32>, %b: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<1x3xf32>) {
  %e = tensor.empty() : tensor<4x3xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [4, 2] [1, 1] : tensor<4x2xf32> into tensor<4x3xf32>
  %c = tensor.insert_slice %b into %c0[0, 2] [4, 1] [1, 1] : tensor<4x1xf32> into tensor<4x3xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<1x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x3xf32>) -> tensor<1x3xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<1x4xf32>, tensor<4x3xf32>) outs(%acc : tensor<1x3xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x3xf32>
  return %c, %mm : tensor<4x3xf32>, tensor<1x3xf32>
}

// Along the contraction axis: each part takes its columns of the lhs, and the
// parts accumulate into the whole product in turn.
// CHECK-LABEL: func.func @contraction(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<1x4xf32>, %[[A:[^:]+]]: tensor<3x2xf32>, %[[B:[^:]+]]: tensor<1x2xf32>)
// CHECK:         %[[E:.+]] = tensor.empty() : tensor<4x2xf32>
// CHECK:         %[[ACC:.+]] = linalg.fill
// CHECK:         %[[SLOT0:.+]] = tensor.extract_slice %[[E]][0, 0] [3, 2] [1, 1]
// CHECK:         %[[Q0:.+]] = tensor.extract_slice %[[Q]][0, 0] [1, 3] [1, 1]
// CHECK:         %[[P0:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q0]], %[[A]] : tensor<1x3xf32>, tensor<3x2xf32>) outs(%[[ACC]], %[[SLOT0]] : tensor<1x2xf32>, tensor<3x2xf32>)
// CHECK:         %[[C0:.+]] = tensor.insert_slice %[[P0]]#1 into %[[E]][0, 0] [3, 2] [1, 1]
// CHECK:         %[[SLOT1:.+]] = tensor.extract_slice %[[C0]][3, 0] [1, 2] [1, 1]
// CHECK:         %[[Q1:.+]] = tensor.extract_slice %[[Q]][0, 3] [1, 1] [1, 1]
// CHECK:         %[[P1:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q1]], %[[B]] : tensor<1x1xf32>, tensor<1x2xf32>) outs(%[[P0]]#0, %[[SLOT1]] : tensor<1x2xf32>, tensor<1x2xf32>)
// CHECK:         %[[C:.+]] = tensor.insert_slice %[[P1]]#1 into %[[C0]][3, 0] [1, 2] [1, 1]
// CHECK:         return %[[C]], %[[P1]]#0 : tensor<4x2xf32>, tensor<1x2xf32>
func.func @contraction(%q: tensor<1x4xf32>, %a: tensor<3x2xf32>, %b: tensor<1x2xf32>) -> (tensor<4x2xf32>, tensor<1x2xf32>) {
  %e = tensor.empty() : tensor<4x2xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [3, 2] [1, 1] : tensor<3x2xf32> into tensor<4x2xf32>
  %c = tensor.insert_slice %b into %c0[3, 0] [1, 2] [1, 1] : tensor<1x2xf32> into tensor<4x2xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<1x2xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x2xf32>) -> tensor<1x2xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<1x4xf32>, tensor<4x2xf32>) outs(%acc : tensor<1x2xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x2xf32>
  return %c, %mm : tensor<4x2xf32>, tensor<1x2xf32>
}

// Symbolic sizes, batched, as the decode step's k_next = concat(k_past, k_new)
// along the column axis: offsets and sizes are the concat's own index values.
// CHECK-LABEL: func.func @dynamic_columns(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<?x1x?xf32>, %[[A:[^:]+]]: tensor<?x?x?xf32>, %[[B:[^:]+]]: tensor<?x?x1xf32>)
// CHECK:         %[[BATCH:.+]] = tensor.dim %[[A]], %{{.+}}
// CHECK:         %[[K:.+]] = tensor.dim %[[A]], %{{.+}}
// CHECK:         %[[S:.+]] = tensor.dim %[[A]], %{{.+}}
// CHECK:         %[[E:.+]] = tensor.empty(%[[BATCH]], %[[K]], %{{.+}}) : tensor<?x?x?xf32>
// CHECK:         %[[ACC:.+]] = linalg.fill
// CHECK:         %[[SLOT0:.+]] = tensor.extract_slice %[[E]][0, 0, 0] [%[[BATCH]], %[[K]], %[[S]]] [1, 1, 1]
// CHECK:         %[[ACC0:.+]] = tensor.extract_slice %[[ACC]][0, 0, 0] [%[[BATCH]], 1, %[[S]]] [1, 1, 1]
// CHECK:         %[[P0:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q]], %[[A]] : {{.*}}) outs(%[[ACC0]], %[[SLOT0]] : tensor<?x1x?xf32>, tensor<?x?x?xf32>)
// CHECK:         %[[C0:.+]] = tensor.insert_slice %[[P0]]#1 into %[[E]][0, 0, 0] [%[[BATCH]], %[[K]], %[[S]]]
// CHECK:         %[[MM0:.+]] = tensor.insert_slice %[[P0]]#0 into %[[ACC]][0, 0, 0] [%[[BATCH]], 1, %[[S]]]
// CHECK:         %[[SLOT1:.+]] = tensor.extract_slice %[[C0]][0, 0, %[[S]]] [%[[BATCH]], %[[K]], 1] [1, 1, 1]
// CHECK:         %[[ACC1:.+]] = tensor.extract_slice %[[MM0]][0, 0, %[[S]]] [%[[BATCH]], 1, 1] [1, 1, 1]
// CHECK:         %[[P1:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q]], %[[B]] : {{.*}}) outs(%[[ACC1]], %[[SLOT1]] : tensor<?x1x1xf32>, tensor<?x?x1xf32>)
// CHECK:         %[[C:.+]] = tensor.insert_slice %[[P1]]#1 into %[[C0]][0, 0, %[[S]]] [%[[BATCH]], %[[K]], 1]
// CHECK:         %[[MM:.+]] = tensor.insert_slice %[[P1]]#0 into %[[MM0]][0, 0, %[[S]]] [%[[BATCH]], 1, 1]
// CHECK:         return %[[C]], %[[MM]]
func.func @dynamic_columns(%q: tensor<?x1x?xf32>, %a: tensor<?x?x?xf32>, %b: tensor<?x?x1xf32>) -> (tensor<?x?x?xf32>, tensor<?x1x?xf32>) {
  %i0 = arith.constant 0 : index
  %i1 = arith.constant 1 : index
  %i2 = arith.constant 2 : index
  %batch = tensor.dim %a, %i0 : tensor<?x?x?xf32>
  %k = tensor.dim %a, %i1 : tensor<?x?x?xf32>
  %s = tensor.dim %a, %i2 : tensor<?x?x?xf32>
  %n = arith.addi %s, %i1 : index
  %e = tensor.empty(%batch, %k, %n) : tensor<?x?x?xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0, 0] [%batch, %k, %s] [1, 1, 1] : tensor<?x?x?xf32> into tensor<?x?x?xf32>
  %c = tensor.insert_slice %b into %c0[0, 0, %s] [%batch, %k, 1] [1, 1, 1] : tensor<?x?x1xf32> into tensor<?x?x?xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty(%batch, %n) : tensor<?x1x?xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<?x1x?xf32>) -> tensor<?x1x?xf32>
  %mm = linalg.generic {indexing_maps = [#lhs3, #rhs3, #out3], iterator_types = ["parallel", "parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<?x1x?xf32>, tensor<?x?x?xf32>) outs(%acc : tensor<?x1x?xf32>) {
  ^bb0(%x: f32, %y: f32, %acc_in: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %acc_in, %m : f32
    linalg.yield %r : f32
  } -> tensor<?x1x?xf32>
  return %c, %mm : tensor<?x?x?xf32>, tensor<?x1x?xf32>
}

// Symbolic sizes along the contraction axis, as v_next = concat(v_past, v_new).
// CHECK-LABEL: func.func @dynamic_contraction(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<1x?xf32>, %[[A:[^:]+]]: tensor<?x?xf32>, %[[B:[^:]+]]: tensor<1x?xf32>)
// CHECK:         %[[S:.+]] = tensor.dim %[[A]], %{{.+}}
// CHECK:         %[[D:.+]] = tensor.dim %[[A]], %{{.+}}
// CHECK:         %[[E:.+]] = tensor.empty(%{{.+}}, %[[D]]) : tensor<?x?xf32>
// CHECK:         %[[ACC:.+]] = linalg.fill
// CHECK:         %[[SLOT0:.+]] = tensor.extract_slice %[[E]][0, 0] [%[[S]], %[[D]]] [1, 1]
// CHECK:         %[[Q0:.+]] = tensor.extract_slice %[[Q]][0, 0] [1, %[[S]]] [1, 1]
// CHECK:         %[[P0:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q0]], %[[A]] : tensor<1x?xf32>, tensor<?x?xf32>) outs(%[[ACC]], %[[SLOT0]] : tensor<1x?xf32>, tensor<?x?xf32>)
// CHECK:         %[[C0:.+]] = tensor.insert_slice %[[P0]]#1 into %[[E]][0, 0] [%[[S]], %[[D]]] [1, 1]
// CHECK:         %[[SLOT1:.+]] = tensor.extract_slice %[[C0]][%[[S]], 0] [1, %[[D]]] [1, 1]
// CHECK:         %[[Q1:.+]] = tensor.extract_slice %[[Q]][0, %[[S]]] [1, 1] [1, 1]
// CHECK:         %[[P1:.+]]:2 = linalg.generic
// CHECK-SAME:        ins(%[[Q1]], %[[B]] : tensor<1x1xf32>, tensor<1x?xf32>) outs(%[[P0]]#0, %[[SLOT1]] : tensor<1x?xf32>, tensor<1x?xf32>)
// CHECK:         %[[C:.+]] = tensor.insert_slice %[[P1]]#1 into %[[C0]][%[[S]], 0] [1, %[[D]]] [1, 1]
// CHECK:         return %[[C]], %[[P1]]#0
func.func @dynamic_contraction(%q: tensor<1x?xf32>, %a: tensor<?x?xf32>, %b: tensor<1x?xf32>) -> (tensor<?x?xf32>, tensor<1x?xf32>) {
  %i0 = arith.constant 0 : index
  %i1 = arith.constant 1 : index
  %s = tensor.dim %a, %i0 : tensor<?x?xf32>
  %d = tensor.dim %a, %i1 : tensor<?x?xf32>
  %n = arith.addi %s, %i1 : index
  %e = tensor.empty(%n, %d) : tensor<?x?xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [%s, %d] [1, 1] : tensor<?x?xf32> into tensor<?x?xf32>
  %c = tensor.insert_slice %b into %c0[%s, 0] [1, %d] [1, 1] : tensor<1x?xf32> into tensor<?x?xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty(%d) : tensor<1x?xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x?xf32>) -> tensor<1x?xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<1x?xf32>, tensor<?x?xf32>) outs(%acc : tensor<1x?xf32>) {
  ^bb0(%x: f32, %y: f32, %acc_in: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %acc_in, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x?xf32>
  return %c, %mm : tensor<?x?xf32>, tensor<1x?xf32>
}

// A concat is fused into the first matmul that reads it only; the second reads
// the fused concat.
// CHECK-LABEL: func.func @two_readers(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<1x4xf32>, %[[P:[^:]+]]: tensor<1x4xf32>, %[[A:[^:]+]]: tensor<4x2xf32>, %[[B:[^:]+]]: tensor<4x1xf32>)
// CHECK:         linalg.generic {{.*}} ins(%[[Q]], %[[A]] :
// CHECK:         %[[P1:.+]]:2 = linalg.generic {{.*}} ins(%[[Q]], %[[B]] :
// CHECK:         %[[C:.+]] = tensor.insert_slice %[[P1]]#1 into
// CHECK:         %[[MM2:.+]] = linalg.generic {{.*}} ins(%[[P]], %[[C]] : tensor<1x4xf32>, tensor<4x3xf32>) outs(%{{.+}} : tensor<1x3xf32>)
// CHECK:         return %[[C]], %{{.+}}, %[[MM2]]
func.func @two_readers(%q: tensor<1x4xf32>, %p: tensor<1x4xf32>, %a: tensor<4x2xf32>, %b: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<1x3xf32>, tensor<1x3xf32>) {
  %e = tensor.empty() : tensor<4x3xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [4, 2] [1, 1] : tensor<4x2xf32> into tensor<4x3xf32>
  %c = tensor.insert_slice %b into %c0[0, 2] [4, 1] [1, 1] : tensor<4x1xf32> into tensor<4x3xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<1x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x3xf32>) -> tensor<1x3xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<1x4xf32>, tensor<4x3xf32>) outs(%acc : tensor<1x3xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x3xf32>
  %mm2 = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%p, %c : tensor<1x4xf32>, tensor<4x3xf32>) outs(%acc : tensor<1x3xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x3xf32>
  return %c, %mm, %mm2 : tensor<4x3xf32>, tensor<1x3xf32>, tensor<1x3xf32>
}

// Not fused: the lhs has two rows, so each rhs element is read twice anyway.
// CHECK-LABEL: func.func @two_rows(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<2x4xf32>
// CHECK:         %[[C:.+]] = tensor.insert_slice %{{.+}}[0, 2] [4, 1] [1, 1]
// CHECK-NOT:     tensor.extract_slice
// CHECK:         %[[MM:.+]] = linalg.generic {{.*}} ins(%[[Q]], %[[C]] : tensor<2x4xf32>, tensor<4x3xf32>) outs(%{{.+}} : tensor<2x3xf32>)
// CHECK-NEXT:    ^bb0
// CHECK-NEXT:      arith.mulf
// CHECK-NEXT:      arith.addf
// CHECK-NEXT:      linalg.yield %{{[^,]+}} : f32
// CHECK:         return %[[C]], %[[MM]]
func.func @two_rows(%q: tensor<2x4xf32>, %a: tensor<4x2xf32>, %b: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<2x3xf32>) {
  %e = tensor.empty() : tensor<4x3xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [4, 2] [1, 1] : tensor<4x2xf32> into tensor<4x3xf32>
  %c = tensor.insert_slice %b into %c0[0, 2] [4, 1] [1, 1] : tensor<4x1xf32> into tensor<4x3xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<2x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<2x3xf32>) -> tensor<2x3xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<2x4xf32>, tensor<4x3xf32>) outs(%acc : tensor<2x3xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<2x3xf32>
  return %c, %mm : tensor<4x3xf32>, tensor<2x3xf32>
}

// Not fused: the concat is read before the matmul, where a fused concat would not
// exist yet.
// CHECK-LABEL: func.func @read_before(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<1x4xf32>
// CHECK:         %[[C:.+]] = tensor.insert_slice %{{.+}}[0, 2] [4, 1] [1, 1]
// CHECK:         %[[ROW:.+]] = tensor.extract_slice %[[C]][0, 0] [1, 3] [1, 1]
// CHECK-NOT:     tensor.extract_slice
// CHECK:         %[[MM:.+]] = linalg.generic {{.*}} ins(%[[Q]], %[[C]] : tensor<1x4xf32>, tensor<4x3xf32>) outs(%{{.+}} : tensor<1x3xf32>)
// CHECK-NOT:     tensor.insert_slice
// CHECK:         return %[[ROW]], %[[MM]]
func.func @read_before(%q: tensor<1x4xf32>, %a: tensor<4x2xf32>, %b: tensor<4x1xf32>) -> (tensor<1x3xf32>, tensor<1x3xf32>) {
  %e = tensor.empty() : tensor<4x3xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [4, 2] [1, 1] : tensor<4x2xf32> into tensor<4x3xf32>
  %c = tensor.insert_slice %b into %c0[0, 2] [4, 1] [1, 1] : tensor<4x1xf32> into tensor<4x3xf32>
  %row = tensor.extract_slice %c[0, 0] [1, 3] [1, 1] : tensor<4x3xf32> to tensor<1x3xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<1x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x3xf32>) -> tensor<1x3xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<1x4xf32>, tensor<4x3xf32>) outs(%acc : tensor<1x3xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x3xf32>
  return %row, %mm : tensor<1x3xf32>, tensor<1x3xf32>
}

// Not fused: the matmul reads the concat as both lhs and rhs (x @ x with a 1x1 x).
// CHECK-LABEL: func.func @lhs_is_rhs(
// CHECK:         %[[C:.+]] = tensor.insert_slice
// CHECK-NOT:     tensor.extract_slice
// CHECK:         %[[MM:.+]] = linalg.generic {{.*}} ins(%[[C]], %[[C]] : tensor<1x1xf32>, tensor<1x1xf32>) outs(%{{.+}} : tensor<1x1xf32>)
// CHECK:         return %[[MM]]
func.func @lhs_is_rhs(%a: tensor<1x1xf32>) -> tensor<1x1xf32> {
  %e = tensor.empty() : tensor<1x1xf32>
  %c = tensor.insert_slice %a into %e[0, 0] [1, 1] [1, 1] : tensor<1x1xf32> into tensor<1x1xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<1x1xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x1xf32>) -> tensor<1x1xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%c, %c : tensor<1x1xf32>, tensor<1x1xf32>) outs(%acc : tensor<1x1xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x1xf32>
  return %mm : tensor<1x1xf32>
}

// Not fused: the concat runs along the batch axis, neither columns nor contraction.
// CHECK-LABEL: func.func @batch_axis(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<2x1x4xf32>
// CHECK:         %[[C:.+]] = tensor.insert_slice %{{.+}}[1, 0, 0] [1, 4, 3] [1, 1, 1]
// CHECK-NOT:     tensor.extract_slice
// CHECK:         linalg.generic {{.*}} ins(%[[Q]], %[[C]] : tensor<2x1x4xf32>, tensor<2x4x3xf32>) outs(%{{.+}} : tensor<2x1x3xf32>)
func.func @batch_axis(%q: tensor<2x1x4xf32>, %a: tensor<1x4x3xf32>, %b: tensor<1x4x3xf32>) -> tensor<2x1x3xf32> {
  %e = tensor.empty() : tensor<2x4x3xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<1x4x3xf32> into tensor<2x4x3xf32>
  %c = tensor.insert_slice %b into %c0[1, 0, 0] [1, 4, 3] [1, 1, 1] : tensor<1x4x3xf32> into tensor<2x4x3xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<2x1x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<2x1x3xf32>) -> tensor<2x1x3xf32>
  %mm = linalg.generic {indexing_maps = [#lhs3, #rhs3, #out3], iterator_types = ["parallel", "parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<2x1x4xf32>, tensor<2x4x3xf32>) outs(%acc : tensor<2x1x3xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<2x1x3xf32>
  return %mm : tensor<2x1x3xf32>
}

// Not fused: the first part of the concat is also used on its own, so the chain
// cannot be rebuilt around the matmul.
// CHECK-LABEL: func.func @part_used(
// CHECK-SAME:    %[[Q:[^:]+]]: tensor<1x4xf32>
// CHECK:         %[[C0:.+]] = tensor.insert_slice %{{.+}}[0, 0] [4, 2] [1, 1]
// CHECK:         %[[C:.+]] = tensor.insert_slice %{{.+}} into %[[C0]][0, 2] [4, 1] [1, 1]
// CHECK-NOT:     tensor.extract_slice
// CHECK:         %[[MM:.+]] = linalg.generic {{.*}} ins(%[[Q]], %[[C]] : tensor<1x4xf32>, tensor<4x3xf32>)
// CHECK:         return %[[C0]], %[[MM]]
func.func @part_used(%q: tensor<1x4xf32>, %a: tensor<4x2xf32>, %b: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<1x3xf32>) {
  %e = tensor.empty() : tensor<4x3xf32>
  %c0 = tensor.insert_slice %a into %e[0, 0] [4, 2] [1, 1] : tensor<4x2xf32> into tensor<4x3xf32>
  %c = tensor.insert_slice %b into %c0[0, 2] [4, 1] [1, 1] : tensor<4x1xf32> into tensor<4x3xf32>
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<1x3xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<1x3xf32>) -> tensor<1x3xf32>
  %mm = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %c : tensor<1x4xf32>, tensor<4x3xf32>) outs(%acc : tensor<1x3xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x3xf32>
  return %c0, %mm : tensor<4x3xf32>, tensor<1x3xf32>
}
