// RUN: kinac opt %s --passes threads | FileCheck %s
// RUN: kinac opt %s --passes 'threads{copy=false}' | FileCheck %s --check-prefix=CALL
// RUN: kinac opt %s --passes 'threads{fuse=false}' | FileCheck %s --check-prefix=NOFUSE

// Each exported function gains a threaded entry that every thread of a call runs.
// Its ops that touch memory are tasks: a small op is one part, run by whichever
// thread claims it; a large one (here a 3.5 MiB matmul, with the fill of its output)
// is cut along its output columns into parts of whole 64-byte lines, at most two per
// thread, that threads claim until none is left (each the parts of its own range first,
// in order, then the last still free). A task that reads what an earlier
// one wrote first waits until that one's parts are done. Temporaries become views of
// the shared workspace, after the tasks' counters (128 bytes per task); a companion
// function returns the workspace's size. The original function is left as it was;
// with copy=false it becomes a call of the entry on one thread, with a workspace of
// its own whose counters it zeroes.

// CHECK-DAG:   func.func private @kina_claim(index, index, index, index) -> index
// CHECK-DAG:   func.func private @kina_done(index)
// CHECK-DAG:   func.func private @kina_wait(index, index)
// CHECK-LABEL: func.func @kina_f(
// CHECK:         memref.alloc()
// CHECK-NOT:     kina_
// CHECK:         return
// CALL-LABEL:  func.func @kina_f(
// CALL-SAME:     %[[X:[^:]+]]: memref<1x1x576xf32, {{.+}}>, %[[W:[^:]+]]: memref<576x1536xf32, {{.+}}>, %[[O:[^:]+]]: memref<1x1x1536xf32, {{.+}}>)
// CALL-NEXT:     %[[BYTES:.+]] = call @kina_f_workspace(%[[X]], %[[W]], %[[O]])
// CALL-NEXT:     %[[OWN:.+]] = memref.alloc(%[[BYTES]]) {alignment = 64 : i64} : memref<?xi8>
// CALL:          %[[HEAD:.+]] = memref.view %[[OWN]][%{{.+}}][] : memref<?xi8> to memref<384xi8>{{$}}
// CALL:          linalg.fill ins(%{{.+}} : i8) outs(%[[HEAD]] : memref<384xi8>)
// CALL:          call @kina_f_threaded(%[[X]], %[[W]], %[[O]], %c0{{.*}}, %c1{{.*}}, %[[OWN]])
// CALL-NEXT:     return
// CALL-LABEL:  func.func @kina_f_threaded(

// CHECK-LABEL: func.func @kina_f_threaded(
// CHECK-SAME:    %[[TID:[^:]+]]: index, %[[N:[^:]+]]: index, %[[WS:[^:]+]]: memref<?xi8>) attributes {llvm.emit_c_interface}
// CHECK:         %[[ADDR:.+]] = memref.extract_aligned_pointer_as_index %[[WS]]
// CHECK-NOT:     memref.alloc
// CHECK:         %[[T:.+]] = memref.view %[[WS]][%{{.+}}][] : memref<?xi8> to memref<1x1x576xf32>

// task 0, the small op: one part
// CHECK:         %[[C0:.+]] = call @kina_claim(%{{.+}}, %{{.+}}, %[[TID]], %[[N]]) : (index, index, index, index) -> index
// CHECK:         %[[MINE:.+]] = arith.cmpi eq, %[[C0]], %{{.+}} : index
// CHECK-NEXT:    scf.if %[[MINE]] {
// CHECK:           linalg.generic {{.*}} outs(%[[T]] : memref<1x1x576xf32>)
// CHECK:           func.call @kina_done(
// CHECK-NEXT:    }
// the matmul reads %t: wait for task 0's one part
// CHECK:         call @kina_wait(%{{.+}}, %{{.+}}) : (index, index) -> ()

// task 1, the matmul with its fill: 4 parts (the `parts` option) of 384 columns,
// claimed in a loop until none is left
// CHECK:         scf.while : () -> index {
// CHECK-NEXT:      %[[C:.+]] = func.call @kina_claim(%{{.+}}, %[[PARTS:.+]], %[[TID]], %[[N]]) : (index, index, index, index) -> index
// CHECK-NEXT:      %[[MORE:.+]] = arith.cmpi ult, %[[C]], %[[PARTS]] : index
// CHECK-NEXT:      scf.condition(%[[MORE]]) %[[C]] : index
// CHECK-NEXT:    } do {
// CHECK-NEXT:    ^bb0(%[[P:.+]]: index):
// CHECK:           %[[LO:.+]] = arith.muli %[[P]], %{{.+}} : index
// CHECK-NEXT:      %[[W:.+]] = memref.subview %{{.+}}[0, %[[LO]]] [576, 384] [1, 1]
// CHECK-NEXT:      %[[O:.+]] = memref.subview %{{.+}}[0, 0, %[[LO]]] [1, 1, 384] [1, 1, 1]
// CHECK-NEXT:      linalg.fill ins(%{{.+}} : f32) outs(%[[O]] : memref<1x1x384xf32, strided<[?, ?, 1], offset: ?>>)
// CHECK-NEXT:      linalg.generic {{.*}} ins(%[[T]], %[[W]] : {{.*}}) outs(%[[O]] :
// CHECK:           func.call @kina_done(
// CHECK-NEXT:      scf.yield
// CHECK-NEXT:    }

// task 2 reads and writes what task 1 wrote: wait for all its parts
// CHECK:         call @kina_wait(%{{.+}}, %[[PARTS]]) : (index, index) -> ()
// CHECK:         call @kina_claim(
// CHECK:         scf.if
// CHECK:           linalg.generic
// CHECK-NOT:     kina_wait
// CHECK:         return

// the bytes a caller zeroes before each call: the three tasks' counters, not %t
// CHECK-LABEL: func.func @kina_f_counters() -> index attributes {llvm.emit_c_interface}
// CHECK-NEXT:    %[[COUNTERS:.+]] = arith.constant 384 : index
// CHECK-NEXT:    return %[[COUNTERS]] : index

// three tasks' counters (384 bytes), then %t (2304 bytes)
// CHECK-LABEL: func.func @kina_f_workspace(
// CHECK-SAME:    -> index attributes {llvm.emit_c_interface}
// CHECK-NEXT:    %[[BYTES:.+]] = arith.constant 2688 : index
// CHECK-NEXT:    return %[[BYTES]] : index

// With a symbolic width the parts are sized at run time: at most 2 per thread, each
// of whole 64-byte lines, none under `min-bytes`.
// CHECK-LABEL: func.func @kina_g_threaded(
// CHECK-SAME:    %[[N:[^:]+]]: index, %[[WS:[^:]+]]: memref<?xi8>)
// CHECK:         %[[MOST:.+]] = arith.muli %[[N]], %{{.+}} : index
// CHECK:         %[[PARTS:.+]] = arith.minui %{{.+}}, %[[MOST]] : index
// CHECK:         scf.while
// CHECK:           arith.cmpi ult, %{{.+}}, %[[PARTS]] : index
// CHECK:         } do {
// CHECK:           %[[LO:.+]] = arith.minui %{{.+}}, %{{.+}} : index
// CHECK:           %[[HI:.+]] = arith.minui %{{.+}}, %{{.+}} : index
// CHECK-NEXT:      %[[SIZE:.+]] = arith.subi %[[HI]], %[[LO]] : index
// CHECK:           memref.subview %{{.+}}[0, %[[LO]]] [576, %[[SIZE]]] [1, 1]
// CHECK:         call @kina_wait(%{{.+}}, %[[PARTS]])

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

func.func @kina_g(%x: memref<1x1x576xf32>, %w: memref<576x?xf32, strided<[?, 1], offset: ?>>, %out0: memref<1x1x?xf32, strided<[?, ?, 1], offset: ?>>, %t: memref<1x1x?xf32>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out0 : memref<1x1x?xf32, strided<[?, ?, 1], offset: ?>>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%x, %w : memref<1x1x576xf32>, memref<576x?xf32, strided<[?, 1], offset: ?>>) outs(%out0 : memref<1x1x?xf32, strided<[?, ?, 1], offset: ?>>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  linalg.copy ins(%out0 : memref<1x1x?xf32, strided<[?, ?, 1], offset: ?>>) outs(%t : memref<1x1x?xf32>)
  return
}

// An op with no elements is not split (a subview of a dim of size 0 would not verify);
// with no op to share between threads, the function gets no threaded entry.
// CHECK-LABEL: func.func @kina_empty(
// CHECK-NOT:     func.func @kina_empty_threaded(
// CHECK:         return
func.func @kina_empty(%x: memref<0x0x?xf32, strided<[?, ?, 1], offset: ?>>, %out0: memref<0x0x?xf32, strided<[?, ?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
  linalg.copy ins(%x : memref<0x0x?xf32, strided<[?, ?, 1], offset: ?>>) outs(%out0 : memref<0x0x?xf32, strided<[?, ?, 1], offset: ?>>)
  return
}

// A temporary sized from a view of an earlier one (bufferization sizes an alloc by
// memref.dim of what it copies): the dim is folded to the size the view holds, so
// the workspace size is computed from the arguments, and the function is taken.
// CHECK-LABEL: func.func @kina_h_threaded(
// CHECK:         %[[P:.+]] = memref.dim %arg0, %{{.+}} : memref<1x?x192xf32, strided<[?, 192, 1], offset: ?>>
// CHECK:         memref.view %{{.+}}[%{{.+}}][%[[P]]] : memref<?xi8> to memref<1x?x192xf32>
// CHECK:         memref.view %{{.+}}[%{{.+}}][%[[P]]] : memref<?xi8> to memref<1x?x3x64xf32>
// CHECK:         return
// CHECK-LABEL: func.func @kina_h_workspace(
// CHECK-SAME:    %[[X:[^:]+]]: memref<1x?x192xf32, strided<[?, 192, 1], offset: ?>>, %{{.+}}) -> index
// CHECK:         memref.dim %[[X]], %{{.+}} : memref<1x?x192xf32, strided<[?, 192, 1], offset: ?>>
// CHECK-NOT:     memref.view
// CHECK:         return
func.func @kina_h(%x: memref<1x?x192xf32, strided<[?, 192, 1], offset: ?>>, %out0: memref<1x?x3x64xf32>) attributes {llvm.emit_c_interface} {
  %c1 = arith.constant 1 : index
  %p = memref.dim %x, %c1 : memref<1x?x192xf32, strided<[?, 192, 1], offset: ?>>
  %t = memref.alloc(%p) : memref<1x?x192xf32>
  linalg.copy ins(%x : memref<1x?x192xf32, strided<[?, 192, 1], offset: ?>>) outs(%t : memref<1x?x192xf32>)
  %e = memref.expand_shape %t [[0], [1], [2, 3]] output_shape [1, %p, 3, 64] : memref<1x?x192xf32> into memref<1x?x3x64xf32>
  %n = memref.dim %e, %c1 : memref<1x?x3x64xf32>
  %u = memref.alloc(%n) : memref<1x?x3x64xf32>
  linalg.copy ins(%e : memref<1x?x3x64xf32>) outs(%u : memref<1x?x3x64xf32>)
  linalg.copy ins(%u : memref<1x?x3x64xf32>) outs(%out0 : memref<1x?x3x64xf32>)
  return
}

// A prefill matmul, x[1, P, 576] @ W[576, 1536] with P symbolic: cut along its rows,
// every part would read all of W; along its columns, all of x (P x 576, far less at
// any prompt length the split counts on). The op is cut where the parts re-read the
// fewest bytes: W's columns, in 4 parts of a static width (W alone moves enough for
// them), so the loop passes see static sizes along the split, whatever P is.
// CHECK-LABEL: func.func @kina_p_threaded(
// CHECK:         scf.while
// CHECK:           %[[W:.+]] = memref.subview %arg1[0, %{{.+}}] [576, 384] [1, 1]
// CHECK:           linalg.fill
// CHECK:           linalg.generic {{.*}} ins(%arg0, %[[W]] :
// CHECK:         return
func.func @kina_p(%x: memref<1x?x576xf32, strided<[?, ?, 1], offset: ?>>, %w: memref<576x1536xf32, strided<[?, 1], offset: ?>>, %out0: memref<1x?x1536xf32, strided<[?, ?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out0 : memref<1x?x1536xf32, strided<[?, ?, 1], offset: ?>>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%x, %w : memref<1x?x576xf32, strided<[?, ?, 1], offset: ?>>, memref<576x1536xf32, strided<[?, 1], offset: ?>>) outs(%out0 : memref<1x?x1536xf32, strided<[?, ?, 1], offset: ?>>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// A decode attention's weighted sum over the values, probs[1, 8, 1, S] @ V[1, 8, S, 64]:
// cut along the head width (4 parts of 16 columns), every part would read all the
// probabilities and a 64-byte piece of each 256-byte row of V; along the 8 heads (a
// loop that gives `parts` parts), no operand is read twice. The op is cut along the
// heads (S symbolic: parts sized at run time).
// CHECK-LABEL: func.func @kina_heads_threaded(
// CHECK:         scf.while
// CHECK:           %[[P:.+]] = memref.subview %arg0[0, %[[H:.+]], 0, 0] [1, %[[N:.+]], 1, %{{.+}}] [1, 1, 1, 1]
// CHECK:           %[[V:.+]] = memref.subview %arg1[0, %[[H]], 0, 0] [1, %[[N]], %{{.+}}, 64] [1, 1, 1, 1]
// CHECK:           linalg.fill
// CHECK:           linalg.generic {{.*}} ins(%[[P]], %[[V]] :
// CHECK:         return
#hlhs = affine_map<(b, h, i, k, j) -> (b, h, i, k)>
#hrhs = affine_map<(b, h, i, k, j) -> (b, h, k, j)>
#hout = affine_map<(b, h, i, k, j) -> (b, h, i, j)>
func.func @kina_heads(%p: memref<1x8x1x?xf32, strided<[?, ?, ?, 1], offset: ?>>, %v: memref<1x8x?x64xf32, strided<[?, ?, ?, 1], offset: ?>>, %out0: memref<1x8x1x64xf32, strided<[?, ?, ?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out0 : memref<1x8x1x64xf32, strided<[?, ?, ?, 1], offset: ?>>)
  linalg.generic {indexing_maps = [#hlhs, #hrhs, #hout], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]} ins(%p, %v : memref<1x8x1x?xf32, strided<[?, ?, ?, 1], offset: ?>>, memref<1x8x?x64xf32, strided<[?, ?, ?, 1], offset: ?>>) outs(%out0 : memref<1x8x1x64xf32, strided<[?, ?, ?, 1], offset: ?>>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// A prefill's row-wise ops with P symbolic (x * x, its sum over each row, x times that
// sum) are all cut along P, and each reads only the rows of what the ones before it
// wrote: they run as one task, each part the three ops on its rows, in order, with one
// wait after them, not one after each. The chain's parts are whole lines of its
// narrowest output (the sums, [1, P]: 16 rows). The matmul after them reads all of y, so
// it is a task of its own, after a wait. With fuse=false each op is a task.
// CHECK-LABEL: func.func @kina_chain_threaded(
// CHECK:         %[[SQ:.+]] = memref.view %arg5[%{{.+}}][%{{.+}}] : memref<?xi8> to memref<1x?x576xf32>
// CHECK:         %[[S:.+]] = memref.view %arg5[%{{.+}}][%{{.+}}] : memref<?xi8> to memref<1x?xf32>
// CHECK:         %[[Y:.+]] = memref.view %arg5[%{{.+}}][%{{.+}}] : memref<?xi8> to memref<1x?x576xf32>
// CHECK:         %[[CHUNKS:.+]] = arith.ceildivui %{{.+}}, %c16 : index
// CHECK:         scf.while
// CHECK:         ^bb0(%[[C:.+]]: index):
// CHECK:           %[[LO_UNITS:.+]] = arith.muli %[[CHUNKS]], %[[C]] : index
// CHECK:           %[[X1:.+]] = memref.subview %arg0[0, %[[LO:.+]], 0] [1, %[[N:.+]], 576] [1, 1, 1]
// CHECK:           %[[SQ1:.+]] = memref.subview %[[SQ]][0, %[[LO]], 0] [1, %[[N]], 576] [1, 1, 1]
// CHECK:           linalg.generic {{.*}} ins(%[[X1]] : {{.*}} outs(%[[SQ1]] :
// CHECK:           %[[SQ2:.+]] = memref.subview %[[SQ]][0, %[[LO]], 0] [1, %[[N]], 576] [1, 1, 1]
// CHECK:           %[[S2:.+]] = memref.subview %[[S]][0, %[[LO]]] [1, %[[N]]] [1, 1]
// CHECK:           linalg.fill ins(%{{.+}} : f32) outs(%[[S2]] :
// CHECK:           linalg.generic {{.*}} ins(%[[SQ2]] : {{.*}} outs(%[[S2]] :
// CHECK:           %[[Y3:.+]] = memref.subview %[[Y]][0, %[[LO]], 0] [1, %[[N]], 576] [1, 1, 1]
// CHECK:           linalg.generic {{.*}} outs(%[[Y3]] :
// CHECK-NEXT:      ^bb0
// CHECK:           func.call @kina_done
// CHECK-NEXT:      scf.yield
// CHECK-NOT:       linalg.
// CHECK:         call @kina_wait
// CHECK:         scf.while
// CHECK:           linalg.fill
// CHECK:           linalg.generic {{.*}} ins(%[[Y]], %{{.+}} :
// CHECK:         return
// NOFUSE-LABEL: func.func @kina_chain_threaded(
// NOFUSE-COUNT-4: scf.while
// NOFUSE-NOT:     scf.while
// NOFUSE:         return
#row3 = affine_map<(b, p, d) -> (b, p)>
func.func @kina_chain(%x: memref<1x?x576xf32, strided<[?, ?, 1], offset: ?>>, %w: memref<576x1536xf32, strided<[?, 1], offset: ?>>, %out0: memref<1x?x1536xf32, strided<[?, ?, 1], offset: ?>>) attributes {llvm.emit_c_interface} {
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %p = memref.dim %x, %c1 : memref<1x?x576xf32, strided<[?, ?, 1], offset: ?>>
  %sq = memref.alloc(%p) : memref<1x?x576xf32>
  linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x : memref<1x?x576xf32, strided<[?, ?, 1], offset: ?>>) outs(%sq : memref<1x?x576xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  }
  %s = memref.alloc(%p) : memref<1x?xf32>
  linalg.fill ins(%zero : f32) outs(%s : memref<1x?xf32>)
  linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]} ins(%sq : memref<1x?x576xf32>) outs(%s : memref<1x?xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %o, %a : f32
    linalg.yield %m : f32
  }
  %y = memref.alloc(%p) : memref<1x?x576xf32>
  linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x, %s : memref<1x?x576xf32, strided<[?, ?, 1], offset: ?>>, memref<1x?xf32>) outs(%y : memref<1x?x576xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  }
  linalg.fill ins(%zero : f32) outs(%out0 : memref<1x?x1536xf32, strided<[?, ?, 1], offset: ?>>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%y, %w : memref<1x?x576xf32>, memref<576x1536xf32, strided<[?, 1], offset: ?>>) outs(%out0 : memref<1x?x1536xf32, strided<[?, ?, 1], offset: ?>>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}

// The same cut (rows, 4 parts of 64) but the second op reads the first's output
// transposed: its part c reads a piece of every part's rows, so it waits for all of
// them, in a task of its own.
// CHECK-LABEL: func.func @kina_transposed_threaded(
// CHECK:         scf.while
// CHECK:           linalg.generic
// CHECK:           func.call @kina_done
// CHECK-NOT:       linalg.generic
// CHECK:         call @kina_wait
// CHECK:         scf.while
// CHECK:           memref.subview %arg1[0, %{{.+}}, 0] [1, 64, 256]
// CHECK:           linalg.generic
// CHECK:         return
#sq3 = affine_map<(b, p, q) -> (b, p, q)>
func.func @kina_transposed(%x: memref<1x256x256xf32>, %out0: memref<1x256x256xf32>) attributes {llvm.emit_c_interface} {
  %y = memref.alloc() : memref<1x256x256xf32>
  linalg.generic {indexing_maps = [#sq3, #sq3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x : memref<1x256x256xf32>) outs(%y : memref<1x256x256xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  }
  %t = memref.transpose %y (b, p, q) -> (b, q, p) : memref<1x256x256xf32> to memref<1x256x256xf32, strided<[65536, 1, 256]>>
  linalg.generic {indexing_maps = [#sq3, #sq3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%t : memref<1x256x256xf32, strided<[65536, 1, 256]>>) outs(%out0 : memref<1x256x256xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %a, %a : f32
    linalg.yield %m : f32
  }
  return
}

// A parameter's symbolic leading dim is a batch, 1 in a decode step: an op is cut along
// another loop that gives parts where there is one (here the second symbolic dim, H),
// not along it.
// CHECK-LABEL: func.func @kina_heads_not_batch_threaded(
// CHECK:         scf.while
// CHECK:           memref.subview %arg0[0, %{{.+}}, 0] [%{{.+}}, %{{.+}}, 576] [1, 1, 1]
// CHECK:           linalg.generic
// CHECK:         return
#bh = affine_map<(b, h, d) -> (b, h, d)>
func.func @kina_heads_not_batch(%x: memref<?x?x576xf32>, %out0: memref<?x?x576xf32>) attributes {llvm.emit_c_interface} {
  linalg.generic {indexing_maps = [#bh, #bh], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x : memref<?x?x576xf32>) outs(%out0 : memref<?x?x576xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  }
  return
}

// Where the batch is the only loop that gives parts (rows of 8), two ops cut along it
// stay two tasks: as one, the chain would be a single part at decode.
// CHECK-LABEL: func.func @kina_batch_threaded(
// CHECK:         scf.while
// CHECK:           memref.subview %arg0[%{{.+}}, 0] [%{{.+}}, 8] [1, 1]
// CHECK:           linalg.generic
// CHECK:           func.call @kina_done
// CHECK-NOT:       linalg.generic
// CHECK:         call @kina_wait
// CHECK:         scf.while
// CHECK:           linalg.generic
// CHECK:         return
#rows2 = affine_map<(b, d) -> (b, d)>
func.func @kina_batch(%x: memref<?x8xf32>, %out0: memref<?x8xf32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %b = memref.dim %x, %c0 : memref<?x8xf32>
  %y = memref.alloc(%b) : memref<?x8xf32>
  linalg.generic {indexing_maps = [#rows2, #rows2], iterator_types = ["parallel", "parallel"]} ins(%x : memref<?x8xf32>) outs(%y : memref<?x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  }
  linalg.generic {indexing_maps = [#rows2, #rows2], iterator_types = ["parallel", "parallel"]} ins(%y : memref<?x8xf32>) outs(%out0 : memref<?x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %a, %a : f32
    linalg.yield %m : f32
  }
  return
}

// A small op between two matmuls cut the same way (columns, 4 parts of 384) that
// neither writes what the second reads nor touches what it writes runs after it: the
// two matmuls are one task, each part reading its columns of w1 and then of w2 without
// a wait, and the small op a task of one part after them.
// CHECK-LABEL: func.func @kina_hoist_threaded(
// CHECK:         scf.while
// CHECK:           memref.subview %arg1[0, %{{.+}}] [576, 384]
// CHECK:           linalg.generic {{.*}} ins(%arg0, %{{.+}} : memref<1x1x576xf32>, memref<576x384xf32
// CHECK:           memref.subview %arg2[0, %{{.+}}] [576, 384]
// CHECK:           linalg.generic {{.*}} ins(%arg0, %{{.+}} : memref<1x1x576xf32>, memref<576x384xf32
// CHECK:           func.call @kina_done
// CHECK-NOT:       scf.while
// CHECK:         call @kina_claim
// CHECK:         scf.if
// CHECK:           linalg.generic {{.*}} ins(%arg0 : memref<1x1x576xf32>) outs(%arg4 :
// CHECK:         return
// NOFUSE-LABEL: func.func @kina_hoist_threaded(
// NOFUSE-COUNT-2: scf.while
// NOFUSE:         return
func.func @kina_hoist(%x: memref<1x1x576xf32>, %w1: memref<576x1536xf32>, %w2: memref<576x1536xf32>, %out0: memref<1x1x1536xf32>, %out1: memref<1x1x576xf32>, %out2: memref<1x1x1536xf32>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out0 : memref<1x1x1536xf32>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%x, %w1 : memref<1x1x576xf32>, memref<576x1536xf32>) outs(%out0 : memref<1x1x1536xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x : memref<1x1x576xf32>) outs(%out1 : memref<1x1x576xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %a, %a : f32
    linalg.yield %m : f32
  }
  linalg.fill ins(%zero : f32) outs(%out2 : memref<1x1x1536xf32>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%x, %w2 : memref<1x1x576xf32>, memref<576x1536xf32>) outs(%out2 : memref<1x1x1536xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}

// When the second matmul reads what the small op writes, the order stays: three tasks.
// CHECK-LABEL: func.func @kina_hoist_blocked_threaded(
// CHECK:         scf.while
// CHECK:           linalg.generic {{.*}} ins(%arg0, %{{.+}} : memref<1x1x576xf32>, memref<576x384xf32
// CHECK:           func.call @kina_done
// CHECK:         scf.if
// CHECK:           linalg.generic {{.*}} ins(%arg0 : memref<1x1x576xf32>) outs(%arg4 :
// CHECK:         call @kina_wait
// CHECK:         scf.while
// CHECK:           linalg.generic {{.*}} ins(%arg4, %{{.+}} : memref<1x1x576xf32>, memref<576x384xf32
// CHECK:         return
func.func @kina_hoist_blocked(%x: memref<1x1x576xf32>, %w1: memref<576x1536xf32>, %w2: memref<576x1536xf32>, %out0: memref<1x1x1536xf32>, %out1: memref<1x1x576xf32>, %out2: memref<1x1x1536xf32>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%out0 : memref<1x1x1536xf32>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%x, %w1 : memref<1x1x576xf32>, memref<576x1536xf32>) outs(%out0 : memref<1x1x1536xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x : memref<1x1x576xf32>) outs(%out1 : memref<1x1x576xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %a, %a : f32
    linalg.yield %m : f32
  }
  linalg.fill ins(%zero : f32) outs(%out2 : memref<1x1x1536xf32>)
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%out1, %w2 : memref<1x1x576xf32>, memref<576x1536xf32>) outs(%out2 : memref<1x1x1536xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A run of small ops before a split op joins its task when each can be cut into the
// same parts and every part then reads only what the same part wrote (_absorb): the sums
// of split-k's partial rows p[8, 1, 1536] and their square, h, cut into 4 parts of 384
// columns, then the next matmul's split-k chunks of h, viewed [8, 1, 192], 4 parts of 2
// chunks: the same 384 elements of h. One task, no wait between the sums and the matmul.
// Without fuse, or when a small op reads h whole (a mean of it), they stay apart.
// CHECK-LABEL: func.func @kina_absorb_threaded(
// CHECK:         %[[H:.+]] = memref.view %arg5[%{{.+}}][] : memref<?xi8> to memref<1x1x1536xf32>
// CHECK-NOT:     scf.if
// CHECK:         scf.while
// CHECK:         ^bb0(%[[C:.+]]: index):
// CHECK:           %[[LO:.+]] = arith.muli %[[C]], %c384 : index
// CHECK:           %[[H1:.+]] = memref.subview %[[H]][0, 0, %[[LO]]] [1, 1, 384] [1, 1, 1]
// CHECK:           linalg.fill ins(%{{.+}} : f32) outs(%[[H1]] :
// CHECK:           linalg.generic {{.*}} outs(%[[H1]] :
// CHECK:           %[[H2:.+]] = memref.subview %[[H]][0, 0, %[[LO]]] [1, 1, 384] [1, 1, 1]
// CHECK:           linalg.generic {{.*}} ins(%[[H2]] : {{.*}} outs(%[[H2]] :
// CHECK:           %[[LO2:.+]] = arith.muli %[[C]], %c2 : index
// CHECK:           memref.subview %{{.+}}[%[[LO2]], 0, 0] [2, 1, 192] [1, 1, 1]
// CHECK:           memref.subview %arg1[%[[LO2]], 0, 0] [2, 192, 576] [1, 1, 1]
// CHECK:           linalg.fill
// CHECK:           linalg.generic
// CHECK:           func.call @kina_done
// CHECK-NEXT:      scf.yield
// CHECK-NEXT:    }
// CHECK-NOT:     call @kina_
// CHECK:         return
// NOFUSE-LABEL: func.func @kina_absorb_threaded(
// NOFUSE:         call @kina_claim
// NOFUSE:         scf.if
// NOFUSE:         call @kina_wait
// NOFUSE:         scf.while
// NOFUSE:         return
// CHECK-LABEL: func.func @kina_absorb_blocked_threaded(
// CHECK:         scf.if
// CHECK:         call @kina_wait
// CHECK:         scf.while
// CHECK:         return
#skin = affine_map<(c, b, i, j) -> (c, i, j)>
#skout = affine_map<(c, b, i, j) -> (b, i, j)>
#cl = affine_map<(c, i, k, j) -> (c, i, k)>
#cr = affine_map<(c, i, k, j) -> (c, k, j)>
#co = affine_map<(c, i, k, j) -> (c, i, j)>
func.func @kina_absorb(%p: memref<8x1x1536xf32>, %w: memref<8x192x576xf32>, %out0: memref<8x1x576xf32>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  %h = memref.alloc() : memref<1x1x1536xf32>
  linalg.fill ins(%zero : f32) outs(%h : memref<1x1x1536xf32>)
  linalg.generic {indexing_maps = [#skin, #skout], iterator_types = ["reduction", "parallel", "parallel", "parallel"]} ins(%p : memref<8x1x1536xf32>) outs(%h : memref<1x1x1536xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %o, %a : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%h : memref<1x1x1536xf32>) outs(%h : memref<1x1x1536xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  }
  %base, %offset, %sizes:3, %strides:3 = memref.extract_strided_metadata %h : memref<1x1x1536xf32> -> memref<f32>, index, index, index, index, index, index, index
  %hv = memref.reinterpret_cast %h to offset: [%offset], sizes: [8, 1, 192], strides: [192, 192, 1] : memref<1x1x1536xf32> to memref<8x1x192xf32, strided<[192, 192, 1], offset: ?>>
  linalg.fill ins(%zero : f32) outs(%out0 : memref<8x1x576xf32>)
  linalg.generic {indexing_maps = [#cl, #cr, #co], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%hv, %w : memref<8x1x192xf32, strided<[192, 192, 1], offset: ?>>, memref<8x192x576xf32>) outs(%out0 : memref<8x1x576xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}

func.func @kina_absorb_blocked(%p: memref<8x1x1536xf32>, %w: memref<8x192x576xf32>, %out0: memref<8x1x576xf32>, %out1: memref<1x1xf32>) attributes {llvm.emit_c_interface} {
  %zero = arith.constant 0.0 : f32
  %h = memref.alloc() : memref<1x1x1536xf32>
  linalg.fill ins(%zero : f32) outs(%h : memref<1x1x1536xf32>)
  linalg.generic {indexing_maps = [#skin, #skout], iterator_types = ["reduction", "parallel", "parallel", "parallel"]} ins(%p : memref<8x1x1536xf32>) outs(%h : memref<1x1x1536xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %o, %a : f32
    linalg.yield %s : f32
  }
  linalg.fill ins(%zero : f32) outs(%out1 : memref<1x1xf32>)
  linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]} ins(%h : memref<1x1x1536xf32>) outs(%out1 : memref<1x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %o, %a : f32
    linalg.yield %s : f32
  }
  %base, %offset, %sizes:3, %strides:3 = memref.extract_strided_metadata %h : memref<1x1x1536xf32> -> memref<f32>, index, index, index, index, index, index, index
  %hv = memref.reinterpret_cast %h to offset: [%offset], sizes: [8, 1, 192], strides: [192, 192, 1] : memref<1x1x1536xf32> to memref<8x1x192xf32, strided<[192, 192, 1], offset: ?>>
  linalg.fill ins(%zero : f32) outs(%out0 : memref<8x1x576xf32>)
  linalg.generic {indexing_maps = [#cl, #cr, #co], iterator_types = ["parallel", "parallel", "reduction", "parallel"]} ins(%hv, %w : memref<8x1x192xf32, strided<[192, 192, 1], offset: ?>>, memref<8x192x576xf32>) outs(%out0 : memref<8x1x576xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %m : f32
    linalg.yield %r : f32
  }
  return
}
