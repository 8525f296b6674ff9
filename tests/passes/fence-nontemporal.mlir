// RUN: kinac opt %s --passes fence-nontemporal | FileCheck %s

// A function that makes non-temporal stores (vector.store or memref.store, at any
// loop depth) gets an llvm.fence seq_cst before each of its returns; a function
// without them is left as it is.

// CHECK-LABEL: func.func @vector_store_in_loop(
// CHECK:         scf.for
// CHECK-NEXT:      vector.store %{{.+}}, %{{.+}}[%{{.+}}] {alignment = 64 : i64, nontemporal = true}
// CHECK-NEXT:    }
// CHECK-NEXT:    llvm.fence seq_cst
// CHECK-NEXT:    return
func.func @vector_store_in_loop(%v: vector<16xf32>, %slot: memref<64xf32>) {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %c64 = arith.constant 64 : index
  scf.for %j = %c0 to %c64 step %c16 {
    vector.store %v, %slot[%j] {alignment = 64 : i64, nontemporal = true} : memref<64xf32>, vector<16xf32>
  }
  return
}

// Every return, when there are several.
// CHECK-LABEL: func.func @two_returns(
// CHECK:         cf.cond_br
// CHECK:         ^bb1:
// CHECK-NEXT:      memref.store %{{.+}} {nontemporal = true}
// CHECK-NEXT:      llvm.fence seq_cst
// CHECK-NEXT:      return
// CHECK:         ^bb2:
// CHECK-NEXT:      llvm.fence seq_cst
// CHECK-NEXT:      return
func.func @two_returns(%c: i1, %x: f32, %slot: memref<4xf32>, %i: index) {
  cf.cond_br %c, ^bb1, ^bb2
^bb1:
  memref.store %x, %slot[%i] {nontemporal = true} : memref<4xf32>
  return
^bb2:
  return
}

// No non-temporal store, no fence.
// CHECK-LABEL: func.func @ordinary_stores(
// CHECK-NOT:     llvm.fence
// CHECK:         vector.store
// CHECK-NEXT:    memref.store
// CHECK-NEXT:    return
func.func @ordinary_stores(%v: vector<16xf32>, %x: f32, %m: memref<64xf32>, %i: index) {
  vector.store %v, %m[%i] : memref<64xf32>, vector<16xf32>
  memref.store %x, %m[%i] : memref<64xf32>
  return
}

// A store whose nontemporal attribute is false is an ordinary store: no fence.
// CHECK-LABEL: func.func @temporal_false(
// CHECK-NOT:     llvm.fence
// CHECK:         return
func.func @temporal_false(%m: memref<8xf32>, %v: vector<8xf32>) {
  %c0 = arith.constant 0 : index
  vector.store %v, %m[%c0] {nontemporal = false} : memref<8xf32>, vector<8xf32>
  return
}
