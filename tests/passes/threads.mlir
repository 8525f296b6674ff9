// RUN: kinac opt %s --passes threads | FileCheck %s

// Each exported function gains a threaded entry that every thread of a call runs:
// a small op on thread 0 alone, a large one (here a 3.5 MiB matmul, with the fill of
// its output) split by thread id along its output columns, whole 64-byte lines per
// thread, a barrier wherever an op reads what another thread wrote; temporaries
// become views of the shared workspace, whose size a companion function returns.
// The original function is left as it was.

// CHECK:       func.func private @kina_barrier(index, index)
// CHECK-LABEL: func.func @kina_f(
// CHECK:         memref.alloc()
// CHECK-NOT:     kina_barrier
// CHECK:         return

// CHECK-LABEL: func.func @kina_f_threaded(
// CHECK-SAME:    %[[TID:[^:]+]]: index, %[[N:[^:]+]]: index, %[[WS:[^:]+]]: memref<?xi8>) attributes {llvm.emit_c_interface}
// CHECK:         %[[ZERO:.+]] = arith.cmpi eq, %[[TID]], %{{.+}} : index
// CHECK:         %[[ADDR:.+]] = memref.extract_aligned_pointer_as_index %[[WS]]
// CHECK-NOT:     memref.alloc
// CHECK:         %[[T:.+]] = memref.view %[[WS]][%{{.+}}][] : memref<?xi8> to memref<1x1x576xf32>
// CHECK:         scf.if %[[ZERO]] {
// CHECK-NEXT:      linalg.generic {{.*}} outs(%[[T]] : memref<1x1x576xf32>)
// CHECK:         call @kina_barrier(%[[ADDR]], %[[N]])
// CHECK:         %[[PARTS:.+]] = arith.minui %{{.+}}, %[[N]] : index
// CHECK:         %[[LO:.+]] = arith.minui %{{.+}}, %{{.+}} : index
// CHECK:         %[[HI:.+]] = arith.minui %{{.+}}, %{{.+}} : index
// CHECK:         %[[SIZE:.+]] = arith.subi %[[HI]], %[[LO]] : index
// CHECK:         %[[W:.+]] = memref.subview %{{.+}}[0, %[[LO]]] [576, %[[SIZE]]] [1, 1]
// CHECK:         %[[O:.+]] = memref.subview %{{.+}}[0, 0, %[[LO]]] [1, 1, %[[SIZE]]] [1, 1, 1]
// CHECK-NEXT:    linalg.fill ins(%{{.+}} : f32) outs(%[[O]] : memref<1x1x?xf32, strided<[?, ?, 1], offset: ?>>)
// CHECK-NEXT:    linalg.generic {{.*}} ins(%[[T]], %[[W]] : {{.*}}) outs(%[[O]] :
// CHECK:         call @kina_barrier(%[[ADDR]], %[[N]])
// CHECK-NEXT:    scf.if %[[ZERO]] {
// CHECK-NEXT:      linalg.generic
// CHECK-NOT:     kina_barrier
// CHECK:         return

// CHECK-LABEL: func.func @kina_f_workspace(
// CHECK-SAME:    -> index attributes {llvm.emit_c_interface}
// CHECK-NEXT:    %[[BYTES:.+]] = arith.constant 2432 : index
// CHECK-NEXT:    return %[[BYTES]] : index
#id = affine_map<(i, j) -> (i, j)>
#lhs = affine_map<(b, i, k, j) -> (b, i, k)>
#rhs = affine_map<(b, i, k, j) -> (k, j)>
#out = affine_map<(b, i, k, j) -> (b, i, j)>
#id3 = affine_map<(b, i, j) -> (b, i, j)>
func.func @kina_f(%x: memref<1x1x576xf32, strided<[?, ?, 1], offset: ?>>, %w: memref<576x1536xf32, strided<[?, 1], offset: ?>>, %out0: memref<1x1x1536xf32, strided<[?, ?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  %t = memref.alloc() {alignment = 64 : i64} : memref<1x1x576xf32>
  linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x : memref<1x1x576xf32, strided<[?, ?, 1], offset: ?>>) outs(%t : memref<1x1x576xf32>) {
  ^bb0(%in: f32, %o: f32):
    %sq = arith.mulf %in, %in : f32
    linalg.yield %sq : f32
  }
  linalg.fill ins(%zero : f32) outs(%out0 : memref<1x1x1536xf32, strided<[?, ?, 1], offset: ?>>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%t, %w : memref<1x1x576xf32>, memref<576x1536xf32, strided<[?, 1], offset: ?>>) outs(%out0 : memref<1x1x1536xf32, strided<[?, ?, 1], offset: ?>>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%out0 : memref<1x1x1536xf32, strided<[?, ?, 1], offset: ?>>) outs(%out0 : memref<1x1x1536xf32, strided<[?, ?, 1], offset: ?>>) {
  ^bb0(%in: f32, %o: f32):
    %n = arith.negf %in : f32
    linalg.yield %n : f32
  }
  return
}
