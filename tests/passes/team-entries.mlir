// RUN: kinac opt %s --passes team-entries | FileCheck %s

// Each threaded entry's C interface (descriptor pointers, then the thread number, the
// thread count and the workspace's descriptor pointer) gets kina_<f>_team, which loads
// the descriptor pointers from one array, in order, and calls the entry with them.

// CHECK-LABEL: llvm.func @_mlir_ciface_kina_f_threaded(
// CHECK:       llvm.func @kina_f_team(%[[ARGS:.+]]: !llvm.ptr, %[[TID:.+]]: i64, %[[N:.+]]: i64, %[[WS:.+]]: !llvm.ptr) {
// CHECK-NEXT:    %[[A0:.+]] = llvm.load %[[ARGS]] : !llvm.ptr -> !llvm.ptr
// CHECK-NEXT:    %[[P1:.+]] = llvm.getelementptr %[[ARGS]][1] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
// CHECK-NEXT:    %[[A1:.+]] = llvm.load %[[P1]] : !llvm.ptr -> !llvm.ptr
// CHECK-NEXT:    %[[P2:.+]] = llvm.getelementptr %[[ARGS]][2] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
// CHECK-NEXT:    %[[A2:.+]] = llvm.load %[[P2]] : !llvm.ptr -> !llvm.ptr
// CHECK-NEXT:    llvm.call @_mlir_ciface_kina_f_threaded(%[[A0]], %[[A1]], %[[A2]], %[[TID]], %[[N]], %[[WS]])
// CHECK-NEXT:    llvm.return
// CHECK-NEXT:  }
llvm.func @kina_f_threaded(!llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr)
llvm.func @_mlir_ciface_kina_f_threaded(%x: !llvm.ptr, %w: !llvm.ptr, %out0: !llvm.ptr, %tid: i64, %n: i64,
                                        %ws: !llvm.ptr) attributes {llvm.emit_c_interface} {
  llvm.call @kina_f_threaded(%x, %w, %out0, %tid, %n, %ws) : (!llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr) -> ()
  llvm.return
}

// One argument: the array's first slot only, no getelementptr.
// CHECK-LABEL: llvm.func @kina_g_team(
// CHECK-NEXT:    %[[G0:.+]] = llvm.load %{{.+}} : !llvm.ptr -> !llvm.ptr
// CHECK-NEXT:    llvm.call @_mlir_ciface_kina_g_threaded(%[[G0]], %{{.+}}, %{{.+}}, %{{.+}})
llvm.func @_mlir_ciface_kina_g_threaded(%x: !llvm.ptr, %tid: i64, %n: i64, %ws: !llvm.ptr) {
  llvm.return
}

// A function's own C interface (descriptor pointers only) gets kina_<f>_packed(args),
// the same loads and a call with them alone.
// CHECK-LABEL: llvm.func @_mlir_ciface_kina_h(
// CHECK:       llvm.func @kina_h_packed(%[[HA:.+]]: !llvm.ptr) {
// CHECK-NEXT:    %[[H0:.+]] = llvm.load %[[HA]] : !llvm.ptr -> !llvm.ptr
// CHECK-NEXT:    %[[HP:.+]] = llvm.getelementptr %[[HA]][1] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
// CHECK-NEXT:    %[[H1:.+]] = llvm.load %[[HP]] : !llvm.ptr -> !llvm.ptr
// CHECK-NEXT:    llvm.call @_mlir_ciface_kina_h(%[[H0]], %[[H1]]) : (!llvm.ptr, !llvm.ptr) -> ()
// CHECK-NEXT:    llvm.return
// CHECK-NEXT:  }
llvm.func @_mlir_ciface_kina_h(%x: !llvm.ptr, %out0: !llvm.ptr) {
  llvm.return
}

// Left alone: an entry whose team entry exists already, one whose parameters are not
// the threads pass's, the threads pass's sizing functions (they return a size), a
// function of a non-pointer parameter, and a C interface not of a Kina function.
// CHECK:       llvm.func @kina_k_team(%{{.+}}: !llvm.ptr, %{{.+}}: i64, %{{.+}}: i64, %{{.+}}: !llvm.ptr) {
// CHECK-NEXT:    llvm.return
// CHECK-NOT:   llvm.func @kina_k_team
// CHECK-NOT:   llvm.func @kina_odd_team
// CHECK-NOT:   llvm.func @kina_k_workspace_packed
// CHECK-NOT:   llvm.func @kina_k_counters_packed
// CHECK-NOT:   llvm.func @kina_scalar_packed
// CHECK-NOT:   llvm.func @other_packed
// CHECK-NOT:   _packed
llvm.func @_mlir_ciface_kina_k_threaded(%x: !llvm.ptr, %tid: i64, %n: i64, %ws: !llvm.ptr) {
  llvm.return
}
llvm.func @kina_k_team(%args: !llvm.ptr, %tid: i64, %n: i64, %ws: !llvm.ptr) {
  llvm.return
}
llvm.func @_mlir_ciface_kina_odd_threaded(%x: !llvm.ptr, %tid: i32, %n: i64, %ws: !llvm.ptr) {
  llvm.return
}
llvm.func @_mlir_ciface_kina_k_workspace(%x: !llvm.ptr) -> i64 {
  %0 = llvm.mlir.constant(256 : i64) : i64
  llvm.return %0 : i64
}
llvm.func @_mlir_ciface_kina_k_counters() -> i64 {
  %0 = llvm.mlir.constant(128 : i64) : i64
  llvm.return %0 : i64
}
llvm.func @_mlir_ciface_kina_scalar(%x: i64) {
  llvm.return
}
llvm.func @_mlir_ciface_other(%x: !llvm.ptr) {
  llvm.return
}
