// Pass options, written as mlir-opt takes them: NAME{opt=value ...}, several passes by commas.
// RUN: kinac opt %s --passes 'matmul-loops{unroll=4 group-rows=1}' | FileCheck %s --check-prefix=UNROLL4
// RUN: kinac opt %s --passes 'matmul-loops{unroll=1 vector-bytes=64}' | FileCheck %s --check-prefix=ONE
// RUN: kinac opt %s --passes 'matmul-loops{register-row-bytes=0},sum-loops{vector-bytes=64}' | FileCheck %s --check-prefix=BOTH
// Bad options: one line naming the pass, the option, what was expected and what was given; exit 1.
// RUN: not kinac opt %s --passes 'matmul-loops{unrol=4}' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not kinac opt %s --passes 'matmul-loops{unroll=four}' 2>&1 | FileCheck %s --check-prefix=NOTINT
// RUN: not kinac opt %s --passes 'sum-loops{vector-bytes=96}' 2>&1 | FileCheck %s --check-prefix=RANGE
// RUN: not kinac opt %s --passes 'bufferize{x=1}' 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not kinac opt %s --passes 'matmul-loops{unroll=4' 2>&1 | FileCheck %s --check-prefix=BRACE

#lhs = affine_map<(i, k, j) -> (i, k)>
#rhs = affine_map<(i, k, j) -> (k, j)>
#out = affine_map<(i, k, j) -> (i, j)>

// unroll=4: 4 rhs rows per step over j, so k steps by 4 and each step has 4 loads of q.
// UNROLL4-LABEL: func.func @mm(
// UNROLL4:         } else {
// UNROLL4-NEXT:      %[[FOUR:.+]] = arith.constant 4 : index
// UNROLL4:           scf.for %[[K0:.+]] = %{{.+}} to %{{.+}} step %[[FOUR]] {
// UNROLL4:             arith.addi %[[K0]]
// UNROLL4:             arith.addi %[[K0]]
// UNROLL4:             %[[K3:.+]] = arith.addi %[[K0]], %{{.+}} : index
// UNROLL4-NEXT:        memref.load %[[Q:.+]][%[[I:.+]], %[[K0]]] : memref<2x16xf32>
// UNROLL4-COUNT-3:     memref.load %[[Q]][%[[I]], %{{.+}}] : memref<2x16xf32>
// UNROLL4-NOT:         memref.load %[[Q]]
// UNROLL4:             vector.load %{{.+}}[%[[K3]], %{{.+}}] : memref<16x40xf32>, vector<32xf32>
// UNROLL4-NEXT:        arith.mulf
// UNROLL4-NEXT:        arith.addf
// UNROLL4-NEXT:        vector.store
// UNROLL4:         return

// unroll=1 (one rhs row at a time: no run-time choice) and 64-byte vectors.
// ONE-LABEL: func.func @mm(
// ONE-NOT:     scf.if
// ONE-NOT:     vector<32xf32>
// ONE:         vector.load %{{.+}} : memref<16x40xf32>, vector<16xf32>

// register-row-bytes=0: no row of sums in registers; sum-loops with 16 lanes.
// BOTH-LABEL: func.func @mm(
// BOTH-NOT:     scf.index_switch
// BOTH-LABEL: func.func @rowsum(
// BOTH:         scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (vector<16xf32>)
// BOTH-NOT:     vector<64xf32>

// UNKNOWN: kinac opt: error: matmul-loops: unknown option 'unrol': expected one of: unroll, vector-bytes, register-row-bytes, row-at-a-time-bytes, row-at-a-time-gap-bytes
// NOTINT: kinac opt: error: matmul-loops: option 'unroll': expected an integer from 1 to 64, got 'four'
// RANGE: kinac opt: error: sum-loops: option 'vector-bytes': expected a power of two from 4 to 4096, got 96
// NONE: kinac opt: error: bufferize: unknown option 'x': expected one of: none
// BRACE: kinac opt: error: matmul-loops: expected options as matmul-loops{opt=value ...}, got 'matmul-loops{unroll=4'

func.func @mm(%q: memref<2x16xf32>, %k: memref<16x40xf32>, %acc: memref<2x40xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<2x16xf32>, memref<16x40xf32>) outs(%acc : memref<2x40xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

func.func @rowsum(%x: memref<4x1000xf32>, %s: memref<4xf32>) {
  linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>],
                  iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<4x1000xf32>) outs(%s : memref<4xf32>) {
  ^bb0(%v: f32, %acc: f32):
    %t = arith.addf %acc, %v : f32
    linalg.yield %t : f32
  }
  return
}
