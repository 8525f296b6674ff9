// RUN: kinac opt %s --passes broadcast-loops | FileCheck %s

// An elementwise generic with an operand constant along the innermost dim (softmax's
// row maximum) becomes loops over the rows, that operand loaded once per row, then a
// loop over the row reading the others element by element. The same body: the same bits.

#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#col3 = affine_map<(d0, d1, d2) -> (d0, d2)>
#head3 = affine_map<(d0, d1, d2) -> (d0, d1)>
#none = affine_map<(d0, d1) -> ()>
#sum = affine_map<(d0, d1) -> (d0)>
#tr = affine_map<(d0, d1) -> (d1, d0)>
#three = affine_map<(d0, d1) -> (d0, 3)>

// CHECK-LABEL: func.func @softmax_exp(
// CHECK-SAME:    %[[S:[^:]+]]: memref<?x?xf32, strided<[?, 1], offset: ?>>, %[[M:[^:]+]]: memref<?xf32, strided<[1], offset: ?>>)
// CHECK-NOT:     linalg.generic
// CHECK:         scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:      %[[MI:.+]] = memref.load %[[M]][%[[I]]]
// CHECK:           scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:        %[[X:.+]] = memref.load %[[S]][%[[I]], %[[J]]]
// CHECK-NEXT:        %[[D:.+]] = arith.subf %[[X]], %[[MI]] : f32
// CHECK-NEXT:        %[[E:.+]] = math.exp %[[D]] : f32
// CHECK-NEXT:        memref.store %[[E]], %[[S]][%[[I]], %[[J]]]
// CHECK-NEXT:      }
// CHECK-NEXT:    }
func.func @softmax_exp(%s: memref<?x?xf32, strided<[?, 1], offset: ?>>, %m: memref<?xf32, strided<[1], offset: ?>>) {
  linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%s, %m : memref<?x?xf32, strided<[?, 1], offset: ?>>, memref<?xf32, strided<[1], offset: ?>>)
      outs(%s : memref<?x?xf32, strided<[?, 1], offset: ?>>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %e = math.exp %d : f32
    linalg.yield %e : f32
  }
  return
}

// Rank 3: an operand broadcast along the middle dim still indexes the innermost one
// (read per element); the one without it (a scale per (d0, d1)) is loaded per row, and
// the output's old value, read by the body, per element too.
// CHECK-LABEL: func.func @rank3(
// CHECK-SAME:    %[[X:[^:]+]]: memref<2x3x8xf32>, %[[C:[^:]+]]: memref<2x8xf32>, %[[H:[^:]+]]: memref<2x3xf32>, %[[O:[^:]+]]: memref<2x3x8xf32>)
// CHECK:         scf.for %[[A:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:           scf.for %[[B:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:        %[[HS:.+]] = memref.load %[[H]][%[[A]], %[[B]]]
// CHECK:             scf.for %[[K:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:          %[[XV:.+]] = memref.load %[[X]][%[[A]], %[[B]], %[[K]]]
// CHECK-NEXT:          %[[CV:.+]] = memref.load %[[C]][%[[A]], %[[K]]]
// CHECK-NEXT:          %[[OV:.+]] = memref.load %[[O]][%[[A]], %[[B]], %[[K]]]
// CHECK-NEXT:          %[[P:.+]] = arith.mulf %[[XV]], %[[CV]] : f32
// CHECK-NEXT:          %[[Q:.+]] = arith.mulf %[[P]], %[[HS]] : f32
// CHECK-NEXT:          %[[R:.+]] = arith.addf %[[Q]], %[[OV]] : f32
// CHECK-NEXT:          memref.store %[[R]], %[[O]][%[[A]], %[[B]], %[[K]]]
func.func @rank3(%x: memref<2x3x8xf32>, %c: memref<2x8xf32>, %h: memref<2x3xf32>, %o: memref<2x3x8xf32>) {
  linalg.generic {indexing_maps = [#id3, #col3, #head3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %c, %h : memref<2x3x8xf32>, memref<2x8xf32>, memref<2x3xf32>) outs(%o : memref<2x3x8xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32, %acc: f32):
    %p = arith.mulf %a, %b : f32
    %q = arith.mulf %p, %s : f32
    %r = arith.addf %q, %acc : f32
    linalg.yield %r : f32
  }
  return
}

// A rank-0 operand (a scale) and a scalar one are loaded, or used, once per row too;
// an output the body does not read is not loaded.
// CHECK-LABEL: func.func @scalars(
// CHECK-SAME:    %[[X:[^:]+]]: memref<4x16xf32>, %[[E:[^:]+]]: memref<f32>, %[[F:[^:]+]]: f32, %[[O:[^:]+]]: memref<4x16xf32>)
// CHECK:         scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:      %[[ES:.+]] = memref.load %[[E]][] : memref<f32>
// CHECK:           scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:        %[[XV:.+]] = memref.load %[[X]][%[[I]], %[[J]]]
// CHECK-NEXT:        %[[P:.+]] = arith.mulf %[[XV]], %[[ES]] : f32
// CHECK-NEXT:        %[[Q:.+]] = arith.addf %[[P]], %[[F]] : f32
// CHECK-NEXT:        memref.store %[[Q]], %[[O]][%[[I]], %[[J]]]
func.func @scalars(%x: memref<4x16xf32>, %e: memref<f32>, %f: f32, %o: memref<4x16xf32>) {
  linalg.generic {indexing_maps = [#id, #none, #none, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %e, %f : memref<4x16xf32>, memref<f32>, f32) outs(%o : memref<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32, %unused: f32):
    %p = arith.mulf %a, %b : f32
    %q = arith.addf %p, %c : f32
    linalg.yield %q : f32
  }
  return
}

// broadcast(m) of an [R, 1] operand reads it at (d0, 0): loaded once per row, at index 0.
// CHECK-LABEL: func.func @stretched(
// CHECK-SAME:    %[[X:[^:]+]]: memref<4x16xf32>, %[[M:[^:]+]]: memref<4x1xf32>, %[[O:[^:]+]]: memref<4x16xf32>)
// CHECK:         %[[Z:.+]] = arith.constant 0 : index
// CHECK:         scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:      %[[MI:.+]] = memref.load %[[M]][%[[I]], %[[Z]]]
// CHECK:           scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:        %[[XV:.+]] = memref.load %[[X]][%[[I]], %[[J]]]
// CHECK-NEXT:        arith.divf %[[XV]], %[[MI]] : f32
#first = affine_map<(d0, d1) -> (d0, 0)>
func.func @stretched(%x: memref<4x16xf32>, %m: memref<4x1xf32>, %o: memref<4x16xf32>) {
  linalg.generic {indexing_maps = [#id, #first, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %m : memref<4x16xf32>, memref<4x1xf32>) outs(%o : memref<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %unused: f32):
    %d = arith.divf %a, %b : f32
    linalg.yield %d : f32
  }
  return
}

// Left alone: every operand indexes the innermost dim (nothing to hoist), a reduction
// (sum-loops' or convert-linalg-to-loops'), a generic on tensors, a body that reads
// linalg.index, a transposed output, and an input read at a constant other than 0.
// CHECK-LABEL: func.func @left_alone(
// CHECK:         linalg.generic {{.+}} iterator_types = ["parallel", "parallel"]
// CHECK:         linalg.generic {{.+}} iterator_types = ["parallel", "reduction"]
// CHECK:         linalg.generic
// CHECK:         linalg.generic
// CHECK:         linalg.index
// CHECK:         linalg.generic
// CHECK:         linalg.generic
// CHECK-NOT:     scf.for
func.func @left_alone(%x: memref<4x16xf32>, %y: memref<4x16xf32>, %s: memref<4xf32>, %t: tensor<4x16xf32>, %u: tensor<4xf32>,
                      %z: memref<16x4xf32>, %c: memref<4x4xf32>) -> tensor<4x16xf32> {
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<4x16xf32>) outs(%y : memref<4x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %e = math.exp %a : f32
    linalg.yield %e : f32
  }
  linalg.generic {indexing_maps = [#id, #sum], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<4x16xf32>) outs(%s : memref<4xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %acc, %a : f32
    linalg.yield %r : f32
  }
  %r = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%t, %u : tensor<4x16xf32>, tensor<4xf32>) outs(%t : tensor<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    linalg.yield %d : f32
  } -> tensor<4x16xf32>
  linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %s : memref<4x16xf32>, memref<4xf32>) outs(%y : memref<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %i = linalg.index 1 : index
    %ii = arith.index_cast %i : index to i32
    %f = arith.sitofp %ii : i32 to f32
    %d = arith.addf %a, %f : f32
    %e = arith.addf %d, %b : f32
    linalg.yield %e : f32
  }
  linalg.generic {indexing_maps = [#id, #row, #tr], iterator_types = ["parallel", "parallel"]}
      ins(%x, %s : memref<4x16xf32>, memref<4xf32>) outs(%z : memref<16x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    linalg.yield %d : f32
  }
  linalg.generic {indexing_maps = [#id, #three, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %c : memref<4x16xf32>, memref<4x4xf32>) outs(%y : memref<4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    linalg.yield %d : f32
  }
  return %r : tensor<4x16xf32>
}
