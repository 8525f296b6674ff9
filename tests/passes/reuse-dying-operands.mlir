// RUN: kinac opt %s --passes reuse-dying-operands | FileCheck %s

// An all-parallel generic whose init is a tensor.empty takes over an operand that
// dies there (same type, identity map, computed by an op), so that bufferization
// updates that operand's buffer in place.

#id = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#bcast = affine_map<(i, j) -> (0, 0)>
#transposed = affine_map<(i, j) -> (j, i)>

// The softmax chain: exp(x - max), then the divide, each writing over the value
// it consumes; the tensor.empty they would have written is gone.
// CHECK-LABEL: func.func @softmax_tail(
// CHECK-SAME:    %[[X:[^:]+]]: tensor<2x4xf32>, %[[M:[^:]+]]: tensor<2xf32>, %[[T:[^:]+]]: tensor<2xf32>)
// CHECK:         %[[D:.+]] = linalg.generic {{.*}} ins(%[[X]], %[[M]] : tensor<2x4xf32>, tensor<2xf32>) outs(%{{.+}} : tensor<2x4xf32>)
// CHECK:           arith.subf
// CHECK-NOT:     tensor.empty
// CHECK:         %[[EXP:.+]] = linalg.generic {{.*}} ins(%[[D]] : tensor<2x4xf32>) outs(%[[D]] : tensor<2x4xf32>)
// CHECK:           math.exp
// CHECK-NOT:     tensor.empty
// CHECK:         %[[P:.+]] = linalg.generic {{.*}} ins(%[[EXP]], %[[T]] : tensor<2x4xf32>, tensor<2xf32>) outs(%[[EXP]] : tensor<2x4xf32>)
// CHECK:           arith.divf
// CHECK:         %[[E3:.+]] = tensor.empty() : tensor<2x4xf32>
// CHECK:         %[[R:.+]] = linalg.generic {{.*}} ins(%[[P]], %[[P]] : tensor<2x4xf32>, tensor<2x4xf32>) outs(%[[E3]] : tensor<2x4xf32>)
// CHECK:         return %[[R]]
func.func @softmax_tail(%x: tensor<2x4xf32>, %max: tensor<2xf32>, %total: tensor<2xf32>) -> tensor<2x4xf32> {
  %e0 = tensor.empty() : tensor<2x4xf32>
  %d = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %max : tensor<2x4xf32>, tensor<2xf32>) outs(%e0 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %v = arith.subf %a, %b : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  %e1 = tensor.empty() : tensor<2x4xf32>
  %exp = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%d : tensor<2x4xf32>) outs(%e1 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = math.exp %a : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  %e2 = tensor.empty() : tensor<2x4xf32>
  %p = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%exp, %total : tensor<2x4xf32>, tensor<2xf32>) outs(%e2 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %v = arith.divf %a, %b : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  // %p is read twice here and dies here, but the result is returned: it keeps its init.
  %e3 = tensor.empty() : tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%p, %p : tensor<2x4xf32>, tensor<2x4xf32>) outs(%e3 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %v = arith.mulf %a, %b : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}

// The operand taken over is the one with the result's type and an identity map,
// not the broadcast one before it.
// CHECK-LABEL: func.func @broadcast_first(
// CHECK-SAME:    %[[X:[^:]+]]: tensor<2x4xf32>, %[[S:[^:]+]]: tensor<1x1xf32>)
// CHECK:         %[[NEG:.+]] = linalg.generic {{.*}} ins(%[[X]] : tensor<2x4xf32>)
// CHECK-NOT:     tensor.empty
// CHECK:         %[[SCALED:.+]] = linalg.generic {{.*}} ins(%[[S]], %[[NEG]] : tensor<1x1xf32>, tensor<2x4xf32>) outs(%[[NEG]] : tensor<2x4xf32>)
func.func @broadcast_first(%x: tensor<2x4xf32>, %scale: tensor<1x1xf32>) -> tensor<2x4xf32> {
  %e0 = tensor.empty() : tensor<2x4xf32>
  %neg = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x4xf32>) outs(%e0 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.negf %a : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  %e1 = tensor.empty() : tensor<2x4xf32>
  %scaled = linalg.generic {indexing_maps = [#bcast, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%scale, %neg : tensor<1x1xf32>, tensor<2x4xf32>) outs(%e1 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %v = arith.mulf %a, %b : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  %e2 = tensor.empty() : tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%scaled : tensor<2x4xf32>) outs(%e2 : tensor<2x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = arith.negf %a : f32
    linalg.yield %v : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}

// Not reused: an operand of the result's type read through a transposed map (an
// element written early would be read later); the identity-mapped one is taken.
// CHECK-LABEL: func.func @transposed(
// CHECK:         %[[A:.+]] = linalg.generic
// CHECK:         %[[B:.+]] = linalg.generic
// CHECK-NOT:     tensor.empty
// CHECK:         %[[T:.+]] = linalg.generic {indexing_maps = [#{{.+}}, #{{.+}}, #{{.+}}], {{.*}} ins(%[[A]], %[[B]] : tensor<4x4xf32>, tensor<4x4xf32>) outs(%[[B]] : tensor<4x4xf32>)
func.func @transposed(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %e0 = tensor.empty() : tensor<4x4xf32>
  %a = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x4xf32>) outs(%e0 : tensor<4x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<4x4xf32>
  %e1 = tensor.empty() : tensor<4x4xf32>
  %b = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x4xf32>) outs(%e1 : tensor<4x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = math.exp %v : f32
    linalg.yield %n : f32
  } -> tensor<4x4xf32>
  %e2 = tensor.empty() : tensor<4x4xf32>
  %t = linalg.generic {indexing_maps = [#transposed, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<4x4xf32>, tensor<4x4xf32>) outs(%e2 : tensor<4x4xf32>) {
  ^bb0(%u: f32, %v: f32, %o: f32):
    %s = arith.addf %u, %v : f32
    linalg.yield %s : f32
  } -> tensor<4x4xf32>
  %e3 = tensor.empty() : tensor<4x4xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<4x4xf32>) outs(%e3 : tensor<4x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}

// Not reused: a parameter (the caller's), and a parameter's buffer seen through
// bufferization.to_tensor after abi.
// CHECK-LABEL: func.func @parameters(
// CHECK-SAME:    %[[X:[^:]+]]: tensor<2x4xf32>, %[[BUF:[^:]+]]: memref<2x4xf32>)
// CHECK:         %[[T:.+]] = bufferization.to_tensor %[[BUF]]
// CHECK:         %[[E0:.+]] = tensor.empty() : tensor<2x4xf32>
// CHECK:         %[[A:.+]] = linalg.generic {{.*}} ins(%[[X]] : tensor<2x4xf32>) outs(%[[E0]] : tensor<2x4xf32>)
// CHECK:         %[[E1:.+]] = tensor.empty() : tensor<2x4xf32>
// CHECK:         %[[B:.+]] = linalg.generic {{.*}} ins(%[[T]] : tensor<2x4xf32>) outs(%[[E1]] : tensor<2x4xf32>)
// CHECK:         %[[C:.+]] = linalg.generic {{.*}} ins(%[[A]], %[[B]] : tensor<2x4xf32>, tensor<2x4xf32>) outs(%[[A]] : tensor<2x4xf32>)
func.func @parameters(%x: tensor<2x4xf32>, %buf: memref<2x4xf32>) -> tensor<2x4xf32> {
  %t = bufferization.to_tensor %buf restrict : memref<2x4xf32> to tensor<2x4xf32>
  %e0 = tensor.empty() : tensor<2x4xf32>
  %a = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x4xf32>) outs(%e0 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  %e1 = tensor.empty() : tensor<2x4xf32>
  %b = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t : tensor<2x4xf32>) outs(%e1 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  %e2 = tensor.empty() : tensor<2x4xf32>
  %c = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : tensor<2x4xf32>, tensor<2x4xf32>) outs(%e2 : tensor<2x4xf32>) {
  ^bb0(%u: f32, %v: f32, %o: f32):
    %s = arith.addf %u, %v : f32
    linalg.yield %s : f32
  } -> tensor<2x4xf32>
  %e3 = tensor.empty() : tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c : tensor<2x4xf32>) outs(%e3 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}

// Not reused: an operand that is read again later; the one that dies is taken instead.
// CHECK-LABEL: func.func @read_later(
// CHECK:         %[[A:.+]] = linalg.generic
// CHECK:         %[[B:.+]] = linalg.generic
// CHECK:         %[[E:.+]] = tensor.empty() : tensor<2x4xf32>
// CHECK:         %[[C:.+]] = linalg.generic {{.*}} ins(%[[A]] : tensor<2x4xf32>) outs(%[[E]] : tensor<2x4xf32>)
// CHECK:         %[[D:.+]] = linalg.generic {{.*}} ins(%[[A]], %[[C]] : tensor<2x4xf32>, tensor<2x4xf32>) outs(%[[A]] : tensor<2x4xf32>)
// CHECK:         %[[F:.+]] = linalg.generic {{.*}} ins(%[[B]], %[[D]] : tensor<2x4xf32>, tensor<2x4xf32>) outs(%[[B]] : tensor<2x4xf32>)
func.func @read_later(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %e0 = tensor.empty() : tensor<2x4xf32>
  %a = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x4xf32>) outs(%e0 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  %e1 = tensor.empty() : tensor<2x4xf32>
  %b = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x4xf32>) outs(%e1 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = math.exp %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  // %a is read again below: %c gets a buffer of its own.
  %e2 = tensor.empty() : tensor<2x4xf32>
  %c = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<2x4xf32>) outs(%e2 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.mulf %v, %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  %e3 = tensor.empty() : tensor<2x4xf32>
  %d = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a, %c : tensor<2x4xf32>, tensor<2x4xf32>) outs(%e3 : tensor<2x4xf32>) {
  ^bb0(%u: f32, %v: f32, %o: f32):
    %s = arith.addf %u, %v : f32
    linalg.yield %s : f32
  } -> tensor<2x4xf32>
  %e4 = tensor.empty() : tensor<2x4xf32>
  %f = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%b, %d : tensor<2x4xf32>, tensor<2x4xf32>) outs(%e4 : tensor<2x4xf32>) {
  ^bb0(%u: f32, %v: f32, %o: f32):
    %s = arith.subf %u, %v : f32
    linalg.yield %s : f32
  } -> tensor<2x4xf32>
  %e5 = tensor.empty() : tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%f : tensor<2x4xf32>) outs(%e5 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}

// Not changed: a generic whose body reads its init, and a result written into an
// out-buffer (after abi), which keeps its init so that it is still computed there.
// CHECK-LABEL: func.func @kept(
// CHECK-SAME:    %[[X:[^:]+]]: tensor<2x4xf32>, %[[OUT:[^:]+]]: memref<2x4xf32>)
// CHECK:         %[[A:.+]] = linalg.generic {{.*}} ins(%[[X]] : tensor<2x4xf32>)
// CHECK:         %[[E1:.+]] = tensor.empty() : tensor<2x4xf32>
// CHECK:         %[[B:.+]] = linalg.generic {{.*}} ins(%[[A]] : tensor<2x4xf32>) outs(%[[E1]] : tensor<2x4xf32>)
// CHECK:         %[[E2:.+]] = tensor.empty() : tensor<2x4xf32>
// CHECK:         %[[C:.+]] = linalg.generic {{.*}} ins(%[[B]] : tensor<2x4xf32>) outs(%[[E2]] : tensor<2x4xf32>)
// CHECK:         bufferization.materialize_in_destination %[[C]] in restrict writable %[[OUT]]
func.func @kept(%x: tensor<2x4xf32>, %out: memref<2x4xf32>) {
  %e0 = tensor.empty() : tensor<2x4xf32>
  %a = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x4xf32>) outs(%e0 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  %e1 = tensor.empty() : tensor<2x4xf32>
  %b = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<2x4xf32>) outs(%e1 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %s = arith.addf %v, %o : f32
    linalg.yield %s : f32
  } -> tensor<2x4xf32>
  %e2 = tensor.empty() : tensor<2x4xf32>
  %c = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%b : tensor<2x4xf32>) outs(%e2 : tensor<2x4xf32>) {
  ^bb0(%v: f32, %o: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  } -> tensor<2x4xf32>
  bufferization.materialize_in_destination %c in restrict writable %out : (tensor<2x4xf32>, memref<2x4xf32>) -> ()
  return
}
