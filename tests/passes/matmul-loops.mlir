// RUN: kinac opt %s --passes 'matmul-loops{step-rows=1 group-rows=1 side-prefetch-bytes=0}' | FileCheck %s
// RUN: kinac opt %s --passes 'matmul-loops{step-rows=1 group-rows=1}' | FileCheck %s --check-prefix=SIDE
// RUN: kinac opt %s --passes 'matmul-loops{group-rows=1 side-prefetch-bytes=0}' | FileCheck %s --check-prefix=STEP
// RUN: kinac opt %s --passes matmul-loops | FileCheck %s --check-prefix=GROUP
// RUN: kinac opt %s --passes 'matmul-loops{step-rows=1 group-rows=1 prefetch-level=1}' | FileCheck %s --check-prefix=L1

// After bufferization each matmul linalg.generic on memrefs of one element type
// becomes explicit loops: per row, vector<32xf32> steps over j that read 8 rhs
// rows side by side and add their products in the order k, k+1, ..., or, when the
// output row is a whole number of vectors (at most 4), the row of sums carried in
// registers through the k loop. Every element still sums over k in ascending order.

#lhs = affine_map<(i, k, j) -> (i, k)>
#rhs = affine_map<(i, k, j) -> (k, j)>
#out = affine_map<(i, k, j) -> (i, j)>

// A row of 40 is not a whole number of vectors. Decided at run time: rhs rows of at
// most 16 KiB that are nearly back to back (a gap of at most 256 bytes) go one row
// of k at a time (one read stream); others 8 rows of k per step, unrolled and jammed
// into one j loop of vectors, then the tail's whole 64-byte lines as vector<16xf32>
// steps, then scalars; then the remaining k one at a time. The same order of sums.
// One row at a time, by default (step-rows=4) each step over j loads its vector of sums,
// adds 4 rhs rows' products to it in k order and stores it; the last K % 4 rows alone.
// A step of several rows reads that many streams side by side, which the hardware
// prefetchers follow, so it does not prefetch (steps of one row do: @prefetch below).
// By default (group-rows=8) its 2 static rows go together: no loop over them, each
// step over j loads both rows' sums, then each rhs vector once, added into both in k
// order (row 0's products, then row 1's), and stores both.
// GROUP-LABEL: func.func @unrolled(
// GROUP-SAME:    %[[Q:[^:]+]]: memref<2x16xf32>, %[[K:[^:]+]]: memref<16x40xf32>, %[[ACC:[^:]+]]: memref<2x40xf32>)
// GROUP:         scf.if
// GROUP-NEXT:      arith.constant
// GROUP-NEXT:      arith.remui
// GROUP-NEXT:      arith.subi
// GROUP-NEXT:      scf.for %[[K0:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// GROUP:             %[[X00:.+]] = memref.load %[[Q]][%[[R0:.+]], %[[K0]]]
// GROUP:             %[[X10:.+]] = memref.load %[[Q]][%[[R1:.+]], %[[K0]]]
// GROUP:             scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// GROUP:               %[[V00:.+]] = vector.broadcast %[[X00]]
// GROUP:               %[[V10:.+]] = vector.broadcast %[[X10]]
// GROUP:               %[[A0:.+]] = vector.load %[[ACC]][%[[R0]], %[[J]]]
// GROUP-NEXT:          %[[A1:.+]] = vector.load %[[ACC]][%[[R1]], %[[J]]]
// GROUP-NEXT:          %[[Y0:.+]] = vector.load %[[K]][%[[K0]], %[[J]]]
// GROUP-NEXT:          %[[P00:.+]] = arith.mulf %[[V00]], %[[Y0]]
// GROUP-NEXT:          arith.addf %[[A0]], %[[P00]]
// GROUP-NEXT:          %[[P10:.+]] = arith.mulf %[[V10]], %[[Y0]]
// GROUP-NEXT:          arith.addf %[[A1]], %[[P10]]
// GROUP-NOT:           vector.load %[[K]][%[[K0]], %[[J]]]
// GROUP:               vector.store %{{.+}}, %[[ACC]][%[[R0]], %[[J]]]
// GROUP-NEXT:          vector.store %{{.+}}, %[[ACC]][%[[R1]], %[[J]]]
// GROUP:         return
// STEP-LABEL: func.func @unrolled(
// STEP-NOT:     memref.prefetch
// STEP:         scf.if
// STEP:           scf.for %[[K0:.+]] = %{{.+}} to %[[KMAIN:.+]] step %[[FOUR:.+]] {
// STEP:             %[[K1:.+]] = arith.addi %[[K0]], %{{.+}} : index
// STEP:             %[[K2:.+]] = arith.addi %[[K0]], %{{.+}} : index
// STEP:             %[[K3:.+]] = arith.addi %[[K0]], %{{.+}} : index
// STEP:             scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// STEP:               %[[A:.+]] = vector.load %{{.+}}[%{{.+}}, %[[J]]] : memref<2x40xf32>, vector<32xf32>
// STEP-NEXT:          vector.load %{{.+}}[%[[K0]], %[[J]]] : memref<16x40xf32>, vector<32xf32>
// STEP:               arith.addf %[[A]]
// STEP:               vector.load %{{.+}}[%[[K1]], %[[J]]] : memref<16x40xf32>, vector<32xf32>
// STEP:               vector.load %{{.+}}[%[[K2]], %[[J]]] : memref<16x40xf32>, vector<32xf32>
// STEP:               vector.load %{{.+}}[%[[K3]], %[[J]]] : memref<16x40xf32>, vector<32xf32>
// STEP:               %[[A4:.+]] = arith.addf
// STEP-NEXT:          vector.store %[[A4]], %{{.+}}[%{{.+}}, %[[J]]] : memref<2x40xf32>, vector<32xf32>
// STEP:           scf.for %{{.+}} = %[[KMAIN]] to %{{.+}} step %{{.+}} {
// STEP-NOT:         memref.prefetch
// STEP:         } else {
// STEP-NOT:       memref.prefetch
// STEP:         return
// CHECK-LABEL: func.func @unrolled(
// CHECK-SAME:    %[[Q:[^:]+]]: memref<2x16xf32>, %[[K:[^:]+]]: memref<16x40xf32>, %[[ACC:[^:]+]]: memref<2x40xf32>)
// CHECK-NOT:     linalg.generic
// CHECK-NOT:     scf.index_switch
// CHECK:         %{{[^,]+}}, %{{[^,]+}}, %{{[^,]+}}:2, %[[KSTRIDES:[^ ]+]]:2 = memref.extract_strided_metadata %[[K]]
// CHECK:         %[[ROW:.+]] = arith.muli %{{.+}}, %{{.+}} : index
// CHECK:         %[[GAP:.+]] = arith.subi %[[KSTRIDES]]#0, %{{.+}} : index
// CHECK:         %[[SHORT:.+]] = arith.cmpi ule, %[[ROW]], %{{.+}} : index
// CHECK:         %[[DENSE:.+]] = arith.cmpi ule, %{{.+}}, %{{.+}} : index
// CHECK-NEXT:    %[[ONEROW:.+]] = arith.andi %[[SHORT]], %[[DENSE]] : i1
// CHECK:         scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:      scf.if %[[ONEROW]] {
// CHECK-NEXT:        scf.for %[[KR1:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-NEXT:          memref.load %[[Q]][%[[I]], %[[KR1]]]
// CHECK:               vector.load %[[K]][%[[KR1]], %{{.+}}] : memref<16x40xf32>, vector<32xf32>
// CHECK:             }
// CHECK:           } else {
// CHECK-NEXT:        %[[EIGHT:.+]] = arith.constant 8 : index
// CHECK:           scf.for %[[K0:.+]] = %{{.+}} to %[[KMAIN:.+]] step %[[EIGHT]] {
// CHECK:             %[[K1:.+]] = arith.addi %[[K0]], %{{.+}} : index
// CHECK:             %[[K2:.+]] = arith.addi %[[K0]], %{{.+}} : index
// CHECK:             %[[K3:.+]] = arith.addi %[[K0]], %{{.+}} : index
// CHECK:             %[[K4:.+]] = arith.addi %[[K0]], %{{.+}} : index
// CHECK:             %[[K5:.+]] = arith.addi %[[K0]], %{{.+}} : index
// CHECK:             %[[K6:.+]] = arith.addi %[[K0]], %{{.+}} : index
// CHECK:             %[[K7:.+]] = arith.addi %[[K0]], %{{.+}} : index
// CHECK-NEXT:        %[[X0:.+]] = memref.load %[[Q]][%[[I]], %[[K0]]]
// CHECK-NEXT:        %[[X1:.+]] = memref.load %[[Q]][%[[I]], %[[K1]]]
// CHECK-NEXT:        %[[X2:.+]] = memref.load %[[Q]][%[[I]], %[[K2]]]
// CHECK-NEXT:        %[[X3:.+]] = memref.load %[[Q]][%[[I]], %[[K3]]]
// CHECK-NEXT:        %[[X4:.+]] = memref.load %[[Q]][%[[I]], %[[K4]]]
// CHECK-NEXT:        %[[X5:.+]] = memref.load %[[Q]][%[[I]], %[[K5]]]
// CHECK-NEXT:        %[[X6:.+]] = memref.load %[[Q]][%[[I]], %[[K6]]]
// CHECK-NEXT:        %[[X7:.+]] = memref.load %[[Q]][%[[I]], %[[K7]]]
// CHECK:             scf.for %[[J:.+]] = %{{.+}} to %[[JVEC:.+]] step %{{.+}} {
// CHECK-NEXT:          %[[V0:.+]] = vector.broadcast %[[X0]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[V1:.+]] = vector.broadcast %[[X1]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[V2:.+]] = vector.broadcast %[[X2]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[V3:.+]] = vector.broadcast %[[X3]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[V4:.+]] = vector.broadcast %[[X4]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[V5:.+]] = vector.broadcast %[[X5]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[V6:.+]] = vector.broadcast %[[X6]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[V7:.+]] = vector.broadcast %[[X7]] : f32 to vector<32xf32>
// CHECK-NEXT:          %[[A:.+]] = vector.load %[[ACC]][%[[I]], %[[J]]] : memref<2x40xf32>, vector<32xf32>
// CHECK-NEXT:          %[[Y0:.+]] = vector.load %[[K]][%[[K0]], %[[J]]] : memref<16x40xf32>, vector<32xf32>
// CHECK-NEXT:          %[[P0:.+]] = arith.mulf %[[V0]], %[[Y0]] : vector<32xf32>
// CHECK-NEXT:          %[[S0:.+]] = arith.addf %[[A]], %[[P0]] : vector<32xf32>
// CHECK-NEXT:          %[[Y1:.+]] = vector.load %[[K]][%[[K1]], %[[J]]]
// CHECK-NEXT:          %[[P1:.+]] = arith.mulf %[[V1]], %[[Y1]]
// CHECK-NEXT:          %[[S1:.+]] = arith.addf %[[S0]], %[[P1]]
// CHECK-NEXT:          %[[Y2:.+]] = vector.load %[[K]][%[[K2]], %[[J]]]
// CHECK-NEXT:          %[[P2:.+]] = arith.mulf %[[V2]], %[[Y2]]
// CHECK-NEXT:          %[[S2:.+]] = arith.addf %[[S1]], %[[P2]]
// CHECK-NEXT:          %[[Y3:.+]] = vector.load %[[K]][%[[K3]], %[[J]]]
// CHECK-NEXT:          %[[P3:.+]] = arith.mulf %[[V3]], %[[Y3]]
// CHECK-NEXT:          %[[S3:.+]] = arith.addf %[[S2]], %[[P3]]
// CHECK-NEXT:          %[[Y4:.+]] = vector.load %[[K]][%[[K4]], %[[J]]]
// CHECK-NEXT:          %[[P4:.+]] = arith.mulf %[[V4]], %[[Y4]]
// CHECK-NEXT:          %[[S4:.+]] = arith.addf %[[S3]], %[[P4]]
// CHECK-NEXT:          %[[Y5:.+]] = vector.load %[[K]][%[[K5]], %[[J]]]
// CHECK-NEXT:          %[[P5:.+]] = arith.mulf %[[V5]], %[[Y5]]
// CHECK-NEXT:          %[[S5:.+]] = arith.addf %[[S4]], %[[P5]]
// CHECK-NEXT:          %[[Y6:.+]] = vector.load %[[K]][%[[K6]], %[[J]]]
// CHECK-NEXT:          %[[P6:.+]] = arith.mulf %[[V6]], %[[Y6]]
// CHECK-NEXT:          %[[S6:.+]] = arith.addf %[[S5]], %[[P6]]
// CHECK-NEXT:          %[[Y7:.+]] = vector.load %[[K]][%[[K7]], %[[J]]]
// CHECK-NEXT:          %[[P7:.+]] = arith.mulf %[[V7]], %[[Y7]]
// CHECK-NEXT:          %[[S7:.+]] = arith.addf %[[S6]], %[[P7]]
// CHECK-NEXT:          vector.store %[[S7]], %[[ACC]][%[[I]], %[[J]]] : memref<2x40xf32>, vector<32xf32>
// CHECK-NEXT:        }
// CHECK:             scf.for %[[JL:.+]] = %[[JVEC]] to %[[JLINES:.+]] step %{{.+}} {
// CHECK:               %[[AL:.+]] = vector.load %[[ACC]][%[[I]], %[[JL]]] : memref<2x40xf32>, vector<16xf32>
// CHECK:               vector.store %{{.+}}, %[[ACC]][%[[I]], %[[JL]]] : memref<2x40xf32>, vector<16xf32>
// CHECK-NEXT:        }
// CHECK-NEXT:        scf.for %[[JT:.+]] = %[[JLINES]] to %{{.+}} step %{{.+}} {
// CHECK-NEXT:          %[[AT:.+]] = memref.load %[[ACC]][%[[I]], %[[JT]]] : memref<2x40xf32>
// CHECK-NEXT:          %[[YT:.+]] = memref.load %[[K]][%[[K0]], %[[JT]]] : memref<16x40xf32>
// CHECK-NEXT:          %[[PT:.+]] = arith.mulf %[[X0]], %[[YT]] : f32
// CHECK-NEXT:          %{{.+}} = arith.addf %[[AT]], %[[PT]] : f32
// CHECK:               memref.store %{{.+}}, %[[ACC]][%[[I]], %[[JT]]] : memref<2x40xf32>
// CHECK-NEXT:        }
// CHECK-NEXT:      }
// CHECK-NEXT:      scf.for %[[KR:.+]] = %[[KMAIN]] to %{{.+}} step %{{.+}} {
// CHECK-NEXT:        %[[XR:.+]] = memref.load %[[Q]][%[[I]], %[[KR]]]
// CHECK:             scf.for
// CHECK:               vector.load %[[K]][%[[KR]],
// CHECK:             scf.for
// CHECK:               memref.load %[[K]][%[[KR]],
// CHECK:         return
func.func @unrolled(%q: memref<2x16xf32>, %k: memref<16x40xf32>, %acc: memref<2x40xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<2x16xf32>, memref<16x40xf32>) outs(%acc : memref<2x40xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A row of 64 is four 64-byte lines: the register-row switch (case 4) keeps their
// sums in registers through the k loop, with the row-at-a-time loops as its default.
// CHECK-LABEL: func.func @registers(
// CHECK-SAME:    %[[Q:[^:]+]]: memref<1x16xf32>, %[[K:[^:]+]]: memref<16x64xf32>, %[[ACC:[^:]+]]: memref<1x64xf32>)
// CHECK:         scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:           %[[OK:.+]] = arith.cmpi eq,
// CHECK:           %[[N:.+]] = arith.select %[[OK]], %{{.+}}, %{{.+}} : index
// CHECK-NEXT:      scf.index_switch %[[N]]
// CHECK-NEXT:      case 4 {
// CHECK:             %[[A0:.+]] = vector.load %[[ACC]][%[[I]], %[[J0:[a-z0-9_]+]]] : memref<1x64xf32>, vector<16xf32>
// CHECK-NEXT:        %[[A1:.+]] = vector.load %[[ACC]][%[[I]], %[[J1:[a-z0-9_]+]]] : memref<1x64xf32>, vector<16xf32>
// CHECK-NEXT:        %[[A2:.+]] = vector.load %[[ACC]][%[[I]], %[[J2:[a-z0-9_]+]]] : memref<1x64xf32>, vector<16xf32>
// CHECK-NEXT:        %[[A3:.+]] = vector.load %[[ACC]][%[[I]], %[[J3:[a-z0-9_]+]]] : memref<1x64xf32>, vector<16xf32>
// CHECK-NEXT:        %[[SUMS:.+]]:4 = scf.for %[[KK:.+]] = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%[[S0:.+]] = %[[A0]], %[[S1:.+]] = %[[A1]], %[[S2:.+]] = %[[A2]], %[[S3:.+]] = %[[A3]]) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>) {
// CHECK-NEXT:          %[[X:.+]] = memref.load %[[Q]][%[[I]], %[[KK]]]
// CHECK-NEXT:          %[[XV:.+]] = vector.broadcast %[[X]] : f32 to vector<16xf32>
// CHECK-NEXT:          %[[Y0:.+]] = vector.load %[[K]][%[[KK]], %[[J0]]]
// CHECK-NEXT:          %[[P0:.+]] = arith.mulf %[[XV]], %[[Y0]]
// CHECK-NEXT:          %[[N0:.+]] = arith.addf %[[S0]], %[[P0]]
// CHECK-NEXT:          %[[Y1:.+]] = vector.load %[[K]][%[[KK]], %[[J1]]]
// CHECK-NEXT:          %[[P1:.+]] = arith.mulf %[[XV]], %[[Y1]]
// CHECK-NEXT:          %[[N1:.+]] = arith.addf %[[S1]], %[[P1]]
// CHECK:               %[[N3:.+]] = arith.addf %[[S3]], %{{.+}}
// CHECK-NEXT:          scf.yield %[[N0]], %[[N1]], %{{.+}}, %[[N3]]
// CHECK-NEXT:        }
// CHECK-NEXT:        vector.store %[[SUMS]]#0, %[[ACC]][%[[I]], %[[J0]]]
// CHECK-NEXT:        vector.store %[[SUMS]]#1, %[[ACC]][%[[I]], %[[J1]]]
// CHECK-NEXT:        vector.store %[[SUMS]]#2, %[[ACC]][%[[I]], %[[J2]]]
// CHECK-NEXT:        vector.store %[[SUMS]]#3, %[[ACC]][%[[I]], %[[J3]]]
// CHECK-NEXT:        scf.yield
// CHECK-NEXT:      }
// CHECK-NEXT:      default {
// CHECK-NEXT:        scf.if %{{.+}} {
// CHECK:             } else {
// CHECK-NEXT:          %[[EIGHT:.+]] = arith.constant 8 : index
// CHECK:               scf.for %{{.+}} = %{{.+}} to %{{.+}} step %[[EIGHT]] {
func.func @registers(%q: memref<1x16xf32>, %k: memref<16x64xf32>, %acc: memref<1x64xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x16xf32>, memref<16x64xf32>) outs(%acc : memref<1x64xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A symbolic row length: the switch is decided at run time, one case for a row of one
// 64-byte line and one per row of 1 to 4 whole vectors (2, 4, 6, 8 lines).
// CHECK-LABEL: func.func @symbolic(
// CHECK-SAME:    %[[Q:[^:]+]]: memref<1x?xf32>, %[[K:[^:]+]]: memref<?x?xf32>, %[[ACC:[^:]+]]: memref<1x?xf32>)
// CHECK:         %[[NDIM:.+]] = memref.dim %[[ACC]], %{{.+}}
// CHECK:         %[[REM:.+]] = arith.remui %[[NDIM]], %[[W:.+]] : index
// CHECK-NEXT:    %[[OK:.+]] = arith.cmpi eq, %[[REM]], %{{.+}} : index
// CHECK:         %[[NV:.+]] = arith.divui %[[NDIM]], %{{.+}} : index
// CHECK-NEXT:    %[[N:.+]] = arith.select %[[OK]], %[[NV]], %{{.+}} : index
// CHECK-NEXT:    scf.index_switch %[[N]]
// CHECK-NEXT:    case 1 {
// CHECK:           scf.for {{.*}} -> (vector<16xf32>) {
// CHECK:         case 2 {
// CHECK:           scf.for {{.*}} -> (vector<16xf32>, vector<16xf32>) {
// CHECK:         case 4 {
// CHECK:           scf.for {{.*}} -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>) {
// CHECK:         case 6 {
// CHECK:         case 8 {
// CHECK-NOT:     case
// CHECK:         default {
func.func @symbolic(%q: memref<1x?xf32>, %k: memref<?x?xf32>, %acc: memref<1x?xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x?xf32>, memref<?x?xf32>) outs(%acc : memref<1x?xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A row of 160 is 5 vectors, longer than the registers hold: no switch.
// CHECK-LABEL: func.func @long_rows(
// CHECK-NOT:     scf.index_switch
// CHECK:         vector.load
// CHECK:         return
func.func @long_rows(%q: memref<1x16xf32>, %k: memref<16x160xf32>, %acc: memref<1x160xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x16xf32>, memref<16x160xf32>) outs(%acc : memref<1x160xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A row of 8, shorter than one vector: scalar loops only.
// CHECK-LABEL: func.func @short_rows(
// CHECK-NOT:     vector.
// CHECK:         memref.store
// CHECK-NOT:     vector.
// CHECK:         return
func.func @short_rows(%q: memref<1x4xf32>, %k: memref<4x8xf32>, %acc: memref<1x8xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x4xf32>, memref<4x8xf32>) outs(%acc : memref<1x8xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A fused matmul (fuse-concat-matmul's second out, the concat's slot): one k at a
// time, and each rhs row is copied to the slot: plain scalar stores up to the slot
// row's first 64-byte boundary, then aligned non-temporal vectors (whole lines: 32
// elements, then 16), then plain scalars for the last partial line, so that no cache
// line is written both ways. The register rows need every slot row aligned, checked
// at run time. All that only where the slot is not rhs's own memory (checked at run
// time: a cache's filled part passed both as the past and as the prefix of the next,
// an append in place): there the matmul runs as a plain one, its copy left out.
// CHECK-LABEL: func.func @fused(
// CHECK-SAME:    %[[Q:[^:]+]]: memref<1x4xf32>, %[[A:[^:]+]]: memref<4x64xf32, strided<[?, 1], offset: ?>>,
// CHECK-SAME:    %[[ACC:[^:]+]]: memref<1x64xf32>, %[[SLOT:[^:]+]]: memref<4x64xf32, strided<[?, 1], offset: ?>>)
// CHECK:         %{{[^,]+}}, %[[AOFF:[^,]+]], %{{[^,]+}}, %[[ASTR:[^:]+]]:2 = memref.extract_strided_metadata %[[A]]
// CHECK-NEXT:    %[[APTR:.+]] = memref.extract_aligned_pointer_as_index %[[A]]
// CHECK-NEXT:    %{{[^,]+}}, %[[SOFF:[^,]+]], %{{[^,]+}}, %[[SSTR:[^:]+]]:2 = memref.extract_strided_metadata %[[SLOT]]
// CHECK-NEXT:    %[[SPTR:.+]] = memref.extract_aligned_pointer_as_index %[[SLOT]]
// CHECK:         %[[AB:.+]] = arith.muli %[[AOFF]], %[[FOUR:.+]] : index
// CHECK-NEXT:    %[[AADDR:.+]] = arith.addi %[[APTR]], %[[AB]]
// CHECK:         %[[SB:.+]] = arith.muli %[[SOFF]], %{{.+}} : index
// CHECK-NEXT:    %[[SADDR:.+]] = arith.addi %[[SPTR]], %[[SB]]
// CHECK-NEXT:    %[[SAME0:.+]] = arith.cmpi eq, %[[AADDR]], %[[SADDR]]
// CHECK-NEXT:    %[[S0:.+]] = arith.cmpi eq, %[[ASTR]]#0, %[[SSTR]]#0
// CHECK-NEXT:    %[[SAME1:.+]] = arith.andi %[[SAME0]], %[[S0]]
// CHECK-NEXT:    %[[S1:.+]] = arith.cmpi eq, %[[ASTR]]#1, %[[SSTR]]#1
// CHECK-NEXT:    %[[SAME:.+]] = arith.andi %[[SAME1]], %[[S1]]
// CHECK-NEXT:    scf.if %[[SAME]] {
// CHECK-NOT:       %[[SLOT]]
// CHECK:         } else {
// CHECK:         %{{[^,]+}}, %[[OFF:[^,]+]], %{{[^,]+}}, %[[STRIDES:[^:]+]]:2 = memref.extract_strided_metadata %[[SLOT]]
// CHECK-NEXT:    %[[BASE:.+]] = memref.extract_aligned_pointer_as_index %[[SLOT]]
// CHECK:         scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:           arith.muli %[[STRIDES]]#0,
// CHECK:           arith.muli %[[OFF]],
// CHECK-NEXT:      arith.addi %[[BASE]],
// CHECK:           scf.index_switch
// CHECK-NEXT:      case 4 {
// CHECK:             scf.for %[[KK:.+]] = {{.*}} iter_args
// CHECK:               %[[Y0:.+]] = vector.load %[[A]][%[[KK]], %[[J0:[a-z0-9_]+]]]
// CHECK:               vector.store %[[Y0]], %[[SLOT]][%[[KK]], %[[J0]]] {alignment = 64 : i64, nontemporal = true}
// CHECK:               %[[Y1:.+]] = vector.load %[[A]][%[[KK]], %[[J1:[a-z0-9_]+]]]
// CHECK:               vector.store %[[Y1]], %[[SLOT]][%[[KK]], %[[J1]]] {alignment = 64 : i64, nontemporal = true}
// CHECK:           default {
// CHECK-NOT:         scf.if
// CHECK-NEXT:        scf.for %[[K0:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:               %[[HEAD:.+]] = arith.minui
// CHECK-NEXT:          scf.for %[[JH:.+]] = %{{.+}} to %[[HEAD]] step %{{.+}} {
// CHECK:                 %[[YH:.+]] = memref.load %[[A]][%[[K0]], %[[JH]]]
// CHECK:                 memref.store %[[YH]], %[[SLOT]][%[[K0]], %[[JH]]] : memref
// CHECK:               scf.for %[[JV:.+]] = %[[HEAD]] to %[[JEND:.+]] step %{{.+}} {
// CHECK:                 %[[YV:.+]] = vector.load %[[A]][%[[K0]], %[[JV]]] {{.*}} vector<32xf32>
// CHECK:                 vector.store %[[YV]], %[[SLOT]][%[[K0]], %[[JV]]] {alignment = 64 : i64, nontemporal = true}
// CHECK:               scf.for %[[JL:.+]] = %[[JEND]] to %[[JLINES:.+]] step %{{.+}} {
// CHECK:                 %[[YL:.+]] = vector.load %[[A]][%[[K0]], %[[JL]]] {{.*}} vector<16xf32>
// CHECK:                 vector.store %[[YL]], %[[SLOT]][%[[K0]], %[[JL]]] {alignment = 64 : i64, nontemporal = true}
// CHECK:               scf.for %[[JT:.+]] = %[[JLINES]] to %{{.+}} step %{{.+}} {
// CHECK:                 %[[YT:.+]] = memref.load %[[A]][%[[K0]], %[[JT]]]
// CHECK:                 memref.store %[[YT]], %[[SLOT]][%[[K0]], %[[JT]]] : memref
func.func @fused(%q: memref<1x4xf32>, %a: memref<4x64xf32, strided<[?, 1], offset: ?>>, %acc: memref<1x64xf32>, %slot: memref<4x64xf32, strided<[?, 1], offset: ?>>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out, #rhs], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %a : memref<1x4xf32>, memref<4x64xf32, strided<[?, 1], offset: ?>>)
      outs(%acc, %slot : memref<1x64xf32>, memref<4x64xf32, strided<[?, 1], offset: ?>>) {
  ^bb0(%x: f32, %y: f32, %s: f32, %c: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r, %y : f32, f32
  }
  return
}

// A fused widening matmul (an F16 model's attention: F16 operands, F32 sums, the slot
// F16 as the rhs it copies) runs the same loops, each rhs vector stored to the slot as
// loaded and widened for the sums. Its slot's bytes are 2 an element: the alignment is
// checked and the scalar head counted in those, and a vector step covers a whole line
// of the slot (32 elements), so no step writes half a line.
// CHECK-LABEL: func.func @fused_widening(
// CHECK-SAME:    %[[A:[^:]+]]: memref<4x64xf16, strided<[?, 1], offset: ?>>, %{{[^:]+}}: memref<1x64xf32>,
// CHECK-SAME:    %[[SLOT:[^:]+]]: memref<4x64xf16, strided<[?, 1], offset: ?>>)
// CHECK:         %[[TWO0:.+]] = arith.constant 2 : index
// CHECK-NEXT:    arith.muli %{{.+}}, %[[TWO0]] : index
// CHECK:         scf.if %{{.+}} {
// CHECK-NOT:       %[[SLOT]]
// CHECK:         } else {
// CHECK:         %{{[^,]+}}, %[[OFF:[^,]+]], %{{[^,]+}}, %[[STRIDES:[^:]+]]:2 = memref.extract_strided_metadata %[[SLOT]]
// CHECK:           %[[TWO:.+]] = arith.constant 2 : index
// CHECK-NEXT:      arith.muli %[[STRIDES]]#0, %[[TWO]] : index
// CHECK:           case 2 {
// CHECK:               %[[Y0:.+]] = vector.load %[[A]][%{{.+}}] : memref<4x64xf16, strided<[?, 1], offset: ?>>, vector<32xf16>
// CHECK-NEXT:          arith.extf %[[Y0]] : vector<32xf16> to vector<32xf32>
// CHECK:               vector.store %[[Y0]], %[[SLOT]][%{{.+}}] {alignment = 64 : i64, nontemporal = true} : {{.+}}, vector<32xf16>
// CHECK:           default {
// CHECK:               %[[TWO1:.+]] = arith.constant 2 : index
// CHECK-NEXT:          arith.muli %{{.+}}, %[[TWO1]] : index
// CHECK:               %[[TWO2:.+]] = arith.constant 2 : index
// CHECK-NEXT:          arith.divui %{{.+}}, %[[TWO2]] : index
// CHECK:               scf.for
// CHECK:                 memref.store %{{.+}}, %[[SLOT]]
// CHECK:               scf.for
// CHECK:                 %[[YV:.+]] = vector.load %[[A]][%{{.+}}] : memref<4x64xf16, strided<[?, 1], offset: ?>>, vector<32xf16>
// CHECK:                 vector.store %[[YV]], %[[SLOT]][%{{.+}}] {alignment = 64 : i64, nontemporal = true} : {{.+}}, vector<32xf16>
// CHECK-NOT:             vector<16xf16>
// CHECK:               scf.for
// CHECK:                 memref.store %{{.+}}, %[[SLOT]]
// CHECK:         return
func.func @fused_widening(%q: memref<1x4xf16>, %a: memref<4x64xf16, strided<[?, 1], offset: ?>>, %acc: memref<1x64xf32>, %slot: memref<4x64xf16, strided<[?, 1], offset: ?>>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out, #rhs], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %a : memref<1x4xf16>, memref<4x64xf16, strided<[?, 1], offset: ?>>)
      outs(%acc, %slot : memref<1x64xf32>, memref<4x64xf16, strided<[?, 1], offset: ?>>) {
  ^bb0(%x: f16, %y: f16, %s: f32, %c: f16):
    %xw = arith.extf %x : f16 to f32
    %yw = arith.extf %y : f16 to f32
    %m = arith.mulf %xw, %yw : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r, %y : f32, f16
  }
  return
}

// Widening (f16 operands, f32 sums, the reference body's extf): the same loops, each
// loaded f16 vector (and each lhs scalar) extended once, then f32 mulf and addf in k
// order, as the body does for each element. Here the row of sums in registers.
// CHECK-LABEL: func.func @widening(
// CHECK-SAME:    %[[Q:[^:]+]]: memref<1x4xf16>, %[[K:[^:]+]]: memref<4x64xf16>, %[[ACC:[^:]+]]: memref<1x64xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         case 4 {
// CHECK:           scf.for %[[KK:.+]] = %{{.+}} iter_args(%[[S0:.+]] = %{{.+}}, %[[S1:.+]] = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>) {
// CHECK-NEXT:        %[[X:.+]] = memref.load %[[Q]][%{{.+}}, %[[KK]]] : memref<1x4xf16>
// CHECK-NEXT:        %[[XF:.+]] = arith.extf %[[X]] : f16 to f32
// CHECK-NEXT:        %[[XV:.+]] = vector.broadcast %[[XF]] : f32 to vector<16xf32>
// CHECK-NEXT:        %[[Y0:.+]] = vector.load %[[K]][%[[KK]], %{{.+}}] : memref<4x64xf16>, vector<16xf16>
// CHECK-NEXT:        %[[Y0F:.+]] = arith.extf %[[Y0]] : vector<16xf16> to vector<16xf32>
// CHECK-NEXT:        %[[P0:.+]] = arith.mulf %[[XV]], %[[Y0F]] : vector<16xf32>
// CHECK-NEXT:        %{{.+}} = arith.addf %[[S0]], %[[P0]] : vector<16xf32>
// CHECK:           vector.store %{{.+}}, %[[ACC]]{{.+}} : memref<1x64xf32>, vector<16xf32>
// CHECK:         default {
// CHECK:           vector.load %[[K]]{{.+}} : memref<4x64xf16>, vector<32xf16>
// CHECK-NEXT:      arith.extf %{{.+}} : vector<32xf16> to vector<32xf32>
// CHECK:           memref.load %[[K]]{{.+}} : memref<4x64xf16>
// CHECK-NEXT:      arith.extf %{{.+}} : f16 to f32
// CHECK:         return
func.func @widening(%q: memref<1x4xf16>, %k: memref<4x64xf16>, %acc: memref<1x64xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x4xf16>, memref<4x64xf16>) outs(%acc : memref<1x64xf32>) {
  ^bb0(%x: f16, %y: f16, %s: f32):
    %xf = arith.extf %x : f16 to f32
    %yf = arith.extf %y : f16 to f32
    %m = arith.mulf %xf, %yf : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// Not rewritten: a matmul still on tensors (before bufferization).
// CHECK-LABEL: func.func @untouched(
// CHECK-NOT:     scf.for
// CHECK:         linalg.generic {{.*}} ins(%{{.+}}, %{{.+}} : tensor<1x4xf32>, tensor<4x64xf32>) outs(%{{.+}} : tensor<1x64xf32>)
// CHECK-NOT:     scf.for
// CHECK:         return
func.func @untouched(%qt: tensor<1x4xf32>, %kt: tensor<4x64xf32>, %acct: tensor<1x64xf32>) -> tensor<1x64xf32> {
  %t = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%qt, %kt : tensor<1x4xf32>, tensor<4x64xf32>) outs(%acct : tensor<1x64xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  } -> tensor<1x64xf32>
  return %t : tensor<1x64xf32>
}

// Broadcast batch dims (np.matmul's rule, lower.broadcast_matmul_maps): a rank-2 rhs
// under a rank-3 lhs is read at [k, j] by every batch, in the same loops and order.
#blhs = affine_map<(b, i, k, j) -> (b, i, k)>
#brhs = affine_map<(b, i, k, j) -> (k, j)>
#bout = affine_map<(b, i, k, j) -> (b, i, j)>
// CHECK-LABEL: func.func @broadcast_rhs(
// CHECK-SAME:    %[[X:[^:]+]]: memref<2x1x16xf32>, %[[W:[^:]+]]: memref<16x40xf32>, %[[ACC:[^:]+]]: memref<2x1x40xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         scf.for %[[B:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:           scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:             scf.for %[[K0:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:               %[[X0:.+]] = memref.load %[[X]][%[[B]], %[[I]], %[[K0]]] : memref<2x1x16xf32>
// CHECK:               scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:                 %[[V0:.+]] = vector.broadcast %[[X0]] : f32 to vector<32xf32>
// CHECK:                 %[[A:.+]] = vector.load %[[ACC]][%[[B]], %[[I]], %[[J]]] : memref<2x1x40xf32>, vector<32xf32>
// CHECK:                 memref.prefetch %[[W]]
// CHECK:                 %[[Y0:.+]] = vector.load %[[W]][%[[K0]], %[[J]]] : memref<16x40xf32>, vector<32xf32>
// CHECK-NEXT:            %[[P0:.+]] = arith.mulf %[[V0]], %[[Y0]] : vector<32xf32>
// CHECK-NEXT:            %{{.+}} = arith.addf %[[A]], %[[P0]] : vector<32xf32>
func.func @broadcast_rhs(%x: memref<2x1x16xf32>, %w: memref<16x40xf32>, %acc: memref<2x1x40xf32>) {
  linalg.generic {indexing_maps = [#blhs, #brhs, #bout], iterator_types = ["parallel", "parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<2x1x16xf32>, memref<16x40xf32>) outs(%acc : memref<2x1x40xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A batch dim of size 1 stretched to the result's (b: 2 queries against one cache):
// the rhs reads index 0 there and the loop's index in the others.
#slhs = affine_map<(b, h, i, k, j) -> (b, h, i, k)>
#srhs = affine_map<(b, h, i, k, j) -> (0, h, k, j)>
#sout = affine_map<(b, h, i, k, j) -> (b, h, i, j)>
// CHECK-LABEL: func.func @stretched(
// CHECK-SAME:    %[[Q:[^:]+]]: memref<2x3x1x16xf32>, %[[K:[^:]+]]: memref<1x3x16x40xf32>, %[[ACC:[^:]+]]: memref<2x3x1x40xf32>)
// CHECK:         %[[ZERO:.+]] = arith.constant 0 : index
// CHECK-NOT:     linalg.generic
// CHECK:         scf.for %[[B:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:           scf.for %[[H:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:             scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:               scf.for %[[K0:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:                 memref.load %[[Q]][%[[B]], %[[H]], %[[I]], %[[K0]]] : memref<2x3x1x16xf32>
// CHECK:                 vector.load %[[K]][%[[ZERO]], %[[H]], %[[K0]], %{{.+}}] : memref<1x3x16x40xf32>, vector<32xf32>
func.func @stretched(%q: memref<2x3x1x16xf32>, %k: memref<1x3x16x40xf32>, %acc: memref<2x3x1x40xf32>) {
  linalg.generic {indexing_maps = [#slhs, #srhs, #sout], iterator_types = ["parallel", "parallel", "parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<2x3x1x16xf32>, memref<1x3x16x40xf32>) outs(%acc : memref<2x3x1x40xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// Not rewritten: a rhs unit-strided neither along j (the loops load whole vectors
// along it) nor along k (the transposed form's rows); convert-linalg-to-loops lowers it later.
// CHECK-LABEL: func.func @strided_rhs(
// CHECK-NOT:     scf.for
// CHECK:         linalg.generic
// CHECK:         return
func.func @strided_rhs(%q: memref<1x4xf32>, %k: memref<4x64xf32, strided<[128, 2]>>, %acc: memref<1x64xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x4xf32>, memref<4x64xf32, strided<[128, 2]>>) outs(%acc : memref<1x64xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A matmul is recognised from its structure: matmul maps and iterators, and a body
// that is an addf of the accumulator and a mulf of the two operands, in either
// operand order (IEEE add and mul commute exactly, so the sums are the same).
// CHECK-LABEL: func.func @commuted(
// CHECK-NOT:     linalg.generic
// CHECK:         vector.load
// CHECK:         return
func.func @commuted(%q: memref<1x16xf32>, %k: memref<16x40xf32>, %acc: memref<1x40xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x16xf32>, memref<16x40xf32>) outs(%acc : memref<1x40xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %y, %x : f32
    %r = arith.addf %m, %s : f32
    linalg.yield %r : f32
  }
  return
}

// The same maps with another body are not matmuls: a subf, a product added to
// itself, an extra op in the body; each is left to convert-linalg-to-loops.
// CHECK-LABEL: func.func @not_matmuls(
// CHECK-NOT:     scf.for
// CHECK:         arith.subf
// CHECK:         arith.addf %[[P:.+]], %[[P]] : f32
// CHECK:         arith.negf
// CHECK-NOT:     scf.for
// CHECK:         return
func.func @not_matmuls(%q: memref<1x16xf32>, %k: memref<16x40xf32>, %acc: memref<1x40xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x16xf32>, memref<16x40xf32>) outs(%acc : memref<1x40xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.subf %s, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x16xf32>, memref<16x40xf32>) outs(%acc : memref<1x40xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %r = arith.addf %m, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<1x16xf32>, memref<16x40xf32>) outs(%acc : memref<1x40xf32>) {
  ^bb0(%x: f32, %y: f32, %s: f32):
    %m = arith.mulf %x, %y : f32
    %n = arith.negf %m : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// Rows in register tiles (prefill): rows 0-7 of 9 in tiles of 4 rows x 3 vectors, the
// 12 vectors of sums carried through a k loop over a block of at most 128 rhs rows.
// Where rhs rows are a multiple of 4096 bytes apart (checked at run time: they would
// share a few cache sets), each block of rhs (k rows x 96 columns) is first copied to a
// stack buffer, rows back to back; elsewhere the tiles read rhs in place. Either way each
// of the block's vectors is loaded once per k for all 4 rows. Columns 96-99, a partial
// block, are masked (nothing past N is read or written); row 8 goes alone, as a decode row.
// CHECK-LABEL: func.func @tiles(
// CHECK-SAME:    %[[X:[^:]+]]: memref<9x16xf32>, %[[W:[^:]+]]: memref<16x100xf32>, %[[ACC:[^:]+]]: memref<9x100xf32>)
// CHECK:         %[[PACK:.+]] = memref.alloca() : memref<16x96xf32>
// CHECK:         %c4096 = arith.constant 4096 : index
// CHECK-NEXT:    %[[APART:.+]] = arith.remui %{{.+}}, %c4096 : index
// CHECK-NEXT:    %[[ALIASED:.+]] = arith.cmpi eq, %[[APART]], %c0 : index
// CHECK:         %[[REM:.+]] = arith.remui %{{.+}}, %{{.+}} : index
// CHECK-NEXT:    %[[ROWS:.+]] = arith.subi %{{.+}}, %[[REM]] : index
// CHECK:         scf.for %[[KB:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:           %[[KEND:.+]] = arith.minui
// CHECK-NEXT:      scf.for %[[JB:.+]] = %{{.+}} to %[[FULL:.+]] step %{{.+}} {
// CHECK-NEXT:        scf.if %[[ALIASED]] {
// CHECK:               scf.for %[[KC:.+]] = %[[KB]] to %[[KEND]] step %{{.+}} {
// CHECK-NEXT:            %[[ROW:.+]] = arith.subi %[[KC]], %[[KB]] : index
// CHECK-NEXT:            %[[C0:.+]] = vector.load %[[W]][%[[KC]], %{{.+}}] : memref<16x100xf32>, vector<32xf32>
// CHECK:                 vector.store %[[C0]], %[[PACK]][%[[ROW]], %{{.+}}] : memref<16x96xf32>, vector<32xf32>
// CHECK:               scf.for %[[I:.+]] = %{{.+}} to %[[ROWS]] step %{{.+}} {
// CHECK:                 %[[A:.+]]:12 = scf.for %[[K:.+]] = %[[KB]] to %[[KEND]] step %{{.+}} iter_args(%[[S0:[^ ]+]] = {{.+}}) -> (vector<32xf32>, {{.+}}) {
// CHECK-NEXT:              %[[R:.+]] = arith.subi %[[K]], %[[KB]] : index
// CHECK-NEXT:              %[[Y0:.+]] = vector.load %[[PACK]][%[[R]], %{{.+}}] : memref<16x96xf32>, vector<32xf32>
// CHECK-NEXT:              %[[Y1:.+]] = vector.load %[[PACK]][%[[R]],
// CHECK-NEXT:              %[[Y2:.+]] = vector.load %[[PACK]][%[[R]],
// CHECK-NEXT:              %[[X0:.+]] = memref.load %[[X]][%[[I]], %[[K]]]
// CHECK-NEXT:              %[[V0:.+]] = vector.broadcast %[[X0]]
// CHECK-NEXT:              %[[P0:.+]] = arith.mulf %[[V0]], %[[Y0]] : vector<32xf32>
// CHECK-NEXT:              %{{.+}} = arith.addf %[[S0]], %[[P0]] : vector<32xf32>
// CHECK-COUNT-3:           memref.load %[[X]]
// CHECK:                   scf.yield
// CHECK-COUNT-12:        vector.store %{{.+}}, %[[ACC]]
// CHECK:             } else {
// CHECK-NOT:           %[[PACK]]
// CHECK:               scf.for %[[I2:.+]] = %{{.+}} to %[[ROWS]] step %{{.+}} {
// CHECK:                 %{{.+}}:12 = scf.for %[[K2:.+]] = %[[KB]] to %[[KEND]] step %{{.+}} iter_args(%{{.+}}) -> (vector<32xf32>, {{.+}}) {
// CHECK-NEXT:              %{{.+}} = vector.load %[[W]][%[[K2]], %[[JB]]] : memref<16x100xf32>, vector<32xf32>
// CHECK-NEXT:              %{{.+}} = vector.load %[[W]][%[[K2]],
// CHECK-NEXT:              %{{.+}} = vector.load %[[W]][%[[K2]],
// CHECK-NEXT:              %{{.+}} = memref.load %[[X]][%[[I2]], %[[K2]]]
// CHECK:                   scf.yield
// CHECK-COUNT-12:        vector.store %{{.+}}, %[[ACC]]
// CHECK:           scf.for %[[JT:.+]] = %[[FULL]] to %{{.+}} step %{{.+}} {
// CHECK-NEXT:        scf.if %[[ALIASED]] {
// CHECK:               vector.create_mask
// CHECK:               scf.for
// CHECK:                 vector.maskedload %[[W]]
// CHECK:                 vector.store %{{.+}}, %[[PACK]]
// CHECK:               scf.for
// CHECK:                 vector.maskedload %[[ACC]]
// CHECK:                 scf.for
// CHECK:                   vector.load %[[PACK]]
// CHECK:                 vector.maskedstore
// CHECK:             } else {
// CHECK:               scf.for
// CHECK:                 vector.maskedload %[[ACC]]
// CHECK:                 scf.for
// CHECK:                   vector.maskedload %[[W]]
// CHECK:                 vector.maskedstore
// CHECK:         scf.for %{{.+}} = %[[ROWS]] to %{{.+}} step %{{.+}} {
// CHECK-NEXT:      scf.if
// CHECK:         return
// The option fma=true (not the default: other bits than -O0's) multiplies and adds
// with one rounding, in every loop form.
// FMA-LABEL:     func.func @tiles(
// FMA-NOT:       arith.mulf
// FMA:           math.fma %{{.+}}, %{{.+}}, %{{.+}} : vector<32xf32>
// FMA-NOT:       arith.mulf
// FMA:           math.fma %{{.+}}, %{{.+}}, %{{.+}} : f32
// FMA-NOT:       arith.mulf
// FMA:           return
func.func @tiles(%x: memref<9x16xf32>, %w: memref<16x100xf32>, %acc: memref<9x100xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<9x16xf32>, memref<16x100xf32>) outs(%acc : memref<9x100xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// F16 weights in register tiles: the block is widened once, as it is copied (the copy
// holds f32), so the tile's k loop loads f32 vectors and widens nothing of rhs.
// CHECK-LABEL: func.func @tiles_widening(
// CHECK:         %[[PACK:.+]] = memref.alloca() : memref<16x96xf32>
// CHECK:             scf.for %[[KC:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:               %[[C0:.+]] = vector.load %{{.+}} : memref<16x96xf16>, vector<32xf16>
// CHECK-NEXT:          %[[W0:.+]] = arith.extf %[[C0]] : vector<32xf16> to vector<32xf32>
// CHECK-NEXT:          vector.store %[[W0]], %[[PACK]][%{{.+}}, %{{.+}}] : memref<16x96xf32>, vector<32xf32>
// CHECK:               scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args
// CHECK-NOT:             arith.extf
// CHECK:                 scf.yield
func.func @tiles_widening(%x: memref<8x16xf32>, %w: memref<16x96xf16>, %acc: memref<8x96xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<8x16xf32>, memref<16x96xf16>) outs(%acc : memref<8x96xf32>) {
  ^bb0(%a: f32, %b: f16, %s: f32):
    %bf = arith.extf %b : f16 to f32
    %m = arith.mulf %a, %bf : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A widened block is at most 24 KiB (half the L1D, beside the F16 rows it is copied
// from): 64 rows of 96 f32 columns, not tile-k-rows' 128, for a weight of 200 rows;
// f32 weights keep blocks of 128.
// CHECK-LABEL: func.func @tiles_widened_blocks(
// CHECK-DAG:     memref.alloca() : memref<64x96xf32>
// CHECK-DAG:     memref.alloca() : memref<128x96xf32>
// CHECK:         return
func.func @tiles_widened_blocks(%x: memref<8x200xf32>, %w: memref<200x96xf16>, %v: memref<200x96xf32>, %acc: memref<8x96xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<8x200xf32>, memref<200x96xf16>) outs(%acc : memref<8x96xf32>) {
  ^bb0(%a: f32, %b: f16, %s: f32):
    %bf = arith.extf %b : f16 to f32
    %m = arith.mulf %a, %bf : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %v : memref<8x200xf32>, memref<200x96xf32>) outs(%acc : memref<8x96xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// F16 activations too: each tile's 4 rows of a block of k are widened into an f32 copy
// (whole lines as vectors, then the last elements alone) before its k loop, which
// broadcasts from the copy: each lhs value is widened once per tile, not once per k step.
// CHECK-LABEL: func.func @tiles_narrow_lhs(
// CHECK-DAG:     %[[PACK:.+]] = memref.alloca() : memref<20x96xf32>
// CHECK-DAG:     %[[XS:.+]] = memref.alloca() : memref<4x20xf32>
// CHECK:               scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:                 %[[XV:.+]] = vector.load %{{.+}} : memref<8x20xf16>, vector<16xf16>
// CHECK-NEXT:            %[[XW:.+]] = arith.extf %[[XV]] : vector<16xf16> to vector<16xf32>
// CHECK-NEXT:            vector.store %[[XW]], %[[XS]][%{{.+}}, %{{.+}}] : memref<4x20xf32>, vector<16xf32>
// CHECK:                 memref.load %{{.+}} : memref<8x20xf16>
// CHECK-NEXT:            arith.extf %{{.+}} : f16 to f32
// CHECK-NEXT:            memref.store %{{.+}}, %[[XS]]
// CHECK:               scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args
// CHECK-NOT:             arith.extf
// CHECK:                 memref.load %[[XS]]
// CHECK-NOT:             arith.extf
// CHECK:                 scf.yield
func.func @tiles_narrow_lhs(%x: memref<8x20xf16>, %w: memref<20x96xf16>, %acc: memref<8x96xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<8x20xf16>, memref<20x96xf16>) outs(%acc : memref<8x96xf32>) {
  ^bb0(%a: f16, %b: f16, %s: f32):
    %af = arith.extf %a : f16 to f32
    %bf = arith.extf %b : f16 to f32
    %m = arith.mulf %af, %bf : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// Two tiled matmuls in one function share one stack buffer for their packed blocks,
// allocated at the function's entry (one per matmul would add up: 48 prefill matmuls of
// 192 KiB each overflowed an 8 MiB stack).
// CHECK-LABEL: func.func @two_tiled(
// CHECK-NEXT:    %[[PACK:.+]] = memref.alloca() : memref<16x96xf32>
// CHECK-NOT:     memref.alloca()
// CHECK:         vector.store %{{.+}}, %[[PACK]]
// CHECK-NOT:     memref.alloca()
// CHECK:         vector.store %{{.+}}, %[[PACK]]
// CHECK:         return
func.func @two_tiled(%x: memref<8x16xf32>, %w: memref<16x96xf32>, %a: memref<8x96xf32>, %b: memref<8x96xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<8x16xf32>, memref<16x96xf32>) outs(%a : memref<8x96xf32>) {
  ^bb0(%p: f32, %q: f32, %s: f32):
    %m = arith.mulf %p, %q : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<8x16xf32>, memref<16x96xf32>) outs(%b : memref<8x96xf32>) {
  ^bb0(%p: f32, %q: f32, %s: f32):
    %m = arith.mulf %p, %q : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// Fewer rows than a tile (decode, 3 rows) take no tiles. One rhs row at a time, each
// vector step prefetches its lines the whole rows ahead that cover prefetch-bytes
// (2048 here: 3 rows of 768 bytes), clamped to K - 1, into L2 (prefetch-level=2:
// locality<2>, prefetcht1); with side-prefetch-bytes=0 the 8-rows-at-a-time loops do
// not prefetch.
// CHECK-LABEL: func.func @prefetch(
// CHECK-SAME:    %[[X:[^:]+]]: memref<3x16xf32>, %[[W:[^:]+]]: memref<16x192xf32>, %[[ACC:[^:]+]]: memref<3x192xf32>)
// CHECK-NOT:     iter_args
// CHECK:         %{{[^,]+}}, %{{[^,]+}}, %{{[^,]+}}:2, %[[STRIDES:[^ ]+]]:2 = memref.extract_strided_metadata %[[W]]
// CHECK:         %[[STRIDE:.+]] = arith.muli %[[STRIDES]]#0, %{{.+}} : index
// CHECK:         %[[UP:.+]] = arith.addi %[[STRIDE]], %{{.+}} : index
// CHECK:         %[[DIV:.+]] = arith.divui %[[UP]], %{{.+}} : index
// CHECK-NEXT:    %[[AHEAD:.+]] = arith.maxui %[[DIV]], %{{.+}} : index
// CHECK:         scf.if
// CHECK-NEXT:      scf.for %[[K:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:             %[[KA:.+]] = arith.addi %[[K]], %[[AHEAD]] : index
// CHECK-NEXT:        %[[KP:.+]] = arith.minui %[[KA]], %{{.+}} : index
// CHECK:             scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK:               %[[J0:.+]] = arith.addi %[[J]], %{{.+}} : index
// CHECK-NEXT:          memref.prefetch %[[W]][%[[KP]], %[[J0]]], read, locality<2>, data : memref<16x192xf32>
// CHECK:               %[[J1:.+]] = arith.addi %[[J]], %{{.+}} : index
// CHECK-NEXT:          memref.prefetch %[[W]][%[[KP]], %[[J1]]], read, locality<2>, data : memref<16x192xf32>
// CHECK-NEXT:          vector.load %[[W]][%[[K]], %[[J]]] : memref<16x192xf32>, vector<32xf32>
// CHECK:           } else {
// CHECK-NOT:         memref.prefetch
// CHECK:         return
// By default (side-prefetch-bytes=512) the 8-rows-at-a-time loops, for long rows or rows far
// apart, prefetch each of the 8 rows' lines of a step 512 bytes (128 f32) further along the
// row, clamped to N - 1 (191): for each of the vector's two lines, one prefetch per row.
// SIDE-LABEL: func.func @prefetch(
// SIDE-SAME:    %{{[^:]+}}: memref<3x16xf32>, %[[W:[^:]+]]: memref<16x192xf32>, %[[ACC:[^:]+]]: memref<3x192xf32>)
// SIDE:         %[[N:.+]] = arith.constant 192 : index
// SIDE:         %[[NLAST:.+]] = arith.subi %[[N]], %{{.+}} : index
// SIDE:         } else {
// SIDE:           scf.for %[[K0:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// SIDE:             %[[K1:.+]] = arith.addi %[[K0]], %{{.+}} : index
// SIDE:             arith.constant 7 : index
// SIDE-NEXT:        %[[K7:.+]] = arith.addi %[[K0]], %{{.+}} : index
// SIDE-NEXT:        memref.load
// SIDE:             scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// SIDE:               vector.load %[[ACC]]
// SIDE-NEXT:          %[[C0:.+]] = arith.constant 128 : index
// SIDE-NEXT:          %[[A0:.+]] = arith.addi %[[J]], %[[C0]] : index
// SIDE-NEXT:          %[[P0:.+]] = arith.minui %[[A0]], %[[NLAST]] : index
// SIDE-NEXT:          %[[C1:.+]] = arith.constant 144 : index
// SIDE-NEXT:          %[[A1:.+]] = arith.addi %[[J]], %[[C1]] : index
// SIDE-NEXT:          %[[P1:.+]] = arith.minui %[[A1]], %[[NLAST]] : index
// SIDE-NEXT:          memref.prefetch %[[W]][%[[K0]], %[[P0]]], read, locality<2>, data
// SIDE-NEXT:          memref.prefetch %[[W]][%[[K0]], %[[P1]]], read, locality<2>, data
// SIDE-NEXT:          memref.prefetch %[[W]][%[[K1]], %[[P0]]], read, locality<2>, data
// SIDE-COUNT-12:      memref.prefetch %[[W]]
// SIDE-NEXT:          memref.prefetch %[[W]][%[[K7]], %[[P1]]], read, locality<2>, data
// SIDE-NEXT:          vector.load %[[W]][%[[K0]], %[[J]]]
// prefetch-level=1: into L1 as well (prefetcht0).
// L1-LABEL: func.func @prefetch(
// L1:         memref.prefetch %{{.+}}, read, locality<3>, data : memref<16x192xf32>
// L1-NOT:     locality<2>
// L1-LABEL: func.func @
func.func @prefetch(%x: memref<3x16xf32>, %w: memref<16x192xf32>, %acc: memref<3x192xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<3x16xf32>, memref<16x192xf32>) outs(%acc : memref<3x192xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// rhs columns that run along k, as lhs rows do (a tied head: table @ xᵀ, x transposed
// by a view): each output is a dot product of two k-contiguous rows. 16 rows (one
// line of F32 sums) at a time: each step of k loads 16 k of every row side by side,
// prefetches the next block's same lines, transposes the 16x16 square in registers
// (4 rounds of 16 two-source shuffles), then adds its columns to the block's vector of
// sums one k after another; the k past the last whole square, one at a time; the rows
// past the last whole block, as scalar dot products. Each sum in k order, as -O0.
// CHECK-LABEL: func.func @transposed(
// CHECK-SAME:    %[[T:[^:]+]]: memref<40x20xf32>, %[[X:[^:]+]]: memref<20x1xf32, strided<[1, 20]>>, %[[ACC:[^:]+]]: memref<40x1xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         scf.for %[[I0:.+]] = %{{.+}} to %{{.+}} step %c16
// CHECK:           scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} {
// CHECK-COUNT-16:    memref.load %[[ACC]]
// CHECK:             %[[START:.+]] = vector.from_elements {{.+}} : vector<16xf32>
// CHECK:             %[[SUMS:.+]] = scf.for %[[K0:.+]] = %{{.+}} to %{{.+}} step %c16{{.*}} iter_args(%[[S:.+]] = %[[START]]) -> (vector<16xf32>) {
// CHECK-COUNT-16:      memref.prefetch %[[T]][%{{.+}}, %[[K0]]], read, locality<3>, data
// CHECK-NEXT:          %[[R0:.+]] = vector.load %[[T]][%[[I0]], %[[K0]]] : memref<40x20xf32>, vector<16xf32>
// CHECK-COUNT-15:      vector.load %[[T]][%{{.+}}, %[[K0]]]
// CHECK-NEXT:          vector.shuffle %[[R0]], %{{.+}} [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23]
// CHECK-COUNT-63:      vector.shuffle
// CHECK-NEXT:          %[[Y0:.+]] = memref.load %[[X]][%[[K0]], %[[J]]]
// CHECK-NEXT:          %[[YV0:.+]] = vector.broadcast %[[Y0]] : f32 to vector<16xf32>
// CHECK-NEXT:          %[[P0:.+]] = arith.mulf %{{.+}}, %[[YV0]] : vector<16xf32>
// CHECK-NEXT:          %[[S1:.+]] = arith.addf %[[S]], %[[P0]] : vector<16xf32>
// CHECK:               %[[P1:.+]] = arith.mulf
// CHECK-NEXT:          arith.addf %[[S1]], %[[P1]] : vector<16xf32>
// CHECK:               scf.yield
// CHECK:             %[[ALL:.+]] = scf.for %[[K:.+]] = %{{.+}} to %c20 step %c1 iter_args(%[[S2:.+]] = %[[SUMS]])
// CHECK-COUNT-16:      memref.load %[[T]][%{{.+}}, %[[K]]]
// CHECK:               vector.from_elements
// CHECK:             %[[L0:.+]] = vector.extract %[[ALL]][0]
// CHECK-NEXT:        memref.store %[[L0]], %[[ACC]][%[[I0]], %[[J]]]
// CHECK:         scf.for %[[I:.+]] = %{{.+}} to %c40 step %c1 {
// CHECK:             scf.for %{{.+}} = %c0 to %c20 step %c1 iter_args(%{{.+}}) -> (f32) {
// CHECK:         return
func.func @transposed(%t: memref<40x20xf32>, %x: memref<20x1xf32, strided<[1, 20]>>, %acc: memref<40x1xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%t, %x : memref<40x20xf32>, memref<20x1xf32, strided<[1, 20]>>) outs(%acc : memref<40x1xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// More columns on the other side (a prompt's rows, x[19, 20] viewed transposed): a
// block of rows takes `transposed-columns` (16) of them at once, each square
// transposed once for all 16 and each column with its own vector of sums, then the
// rest in groups a quarter as wide (4, then 1); with 19 columns, static, only the
// groups of 16 and 1 run, and only they are emitted.
// CHECK-LABEL: func.func @transposed_columns(
// CHECK:         scf.for %[[I0:.+]] = %{{.+}} to %{{.+}} step %c16
// CHECK:           scf.for %{{.+}} = %c0{{.*}} to %{{.+}} step %c16{{.*}} {
// CHECK-COUNT-256:   memref.load %{{.+}} : memref<40x19xf32>
// CHECK:             scf.for {{.+}} -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>) {
// CHECK-COUNT-64:      vector.shuffle
// CHECK-NOT:           vector.shuffle
// CHECK:               scf.yield {{.+}} : vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>{{$}}
// CHECK-NOT:       step %c4
// CHECK:           scf.for %{{.+}} = %{{.+}} to %c19{{.*}} step %c1{{.*}} {
// CHECK:             scf.for {{.+}} -> (vector<16xf32>) {
// CHECK-NOT:       step %c4
// CHECK:         return
func.func @transposed_columns(%t: memref<40x20xf32>, %x: memref<20x19xf32, strided<[1, 20]>>, %acc: memref<40x19xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%t, %x : memref<40x20xf32>, memref<20x19xf32, strided<[1, 20]>>) outs(%acc : memref<40x19xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// The same with F16 operands and F32 sums: rhs is widened once into an F32 copy
// (every block reads all of it), the rows' vectors are widened as loaded.
// CHECK-LABEL: func.func @transposed_widening(
// CHECK:         %[[YS:.+]] = memref.alloc() : memref<20x1xf32>
// CHECK:         arith.extf %{{.+}} : f16 to f32
// CHECK:         memref.store %{{.+}}, %[[YS]]
// CHECK:         vector.load %{{.+}} : memref<40x20xf16>, vector<16xf16>
// CHECK-NEXT:    arith.extf %{{.+}} : vector<16xf16> to vector<16xf32>
// CHECK:         memref.load %[[YS]]
// CHECK:         return
func.func @transposed_widening(%t: memref<40x20xf16>, %x: memref<20x1xf16, strided<[1, 20]>>, %acc: memref<40x1xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%t, %x : memref<40x20xf16>, memref<20x1xf16, strided<[1, 20]>>) outs(%acc : memref<40x1xf32>) {
  ^bb0(%a: f16, %b: f16, %s: f32):
    %ea = arith.extf %a : f16 to f32
    %eb = arith.extf %b : f16 to f32
    %m = arith.mulf %ea, %eb : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// x @ Wᵀ with more columns than rows (a decode row against W[N, K], PyTorch's
// layout): rhs's columns are the blocked rows, read through a view that swaps its
// last two dims; each lane is one output column, x's value at k broadcast.
// CHECK-LABEL: func.func @linear(
// CHECK-SAME:    %[[X:[^:]+]]: memref<1x20xf32>, %[[W:[^:]+]]: memref<20x40xf32, strided<[1, 20]>>, %[[ACC:[^:]+]]: memref<1x40xf32>)
// CHECK:         %[[ROWS:.+]] = memref.transpose %[[W]] (d0, d1) -> (d1, d0) : memref<20x40xf32, strided<[1, 20]>> to memref<40x20xf32, strided<[20, 1]>>
// CHECK:         scf.for %[[J0:.+]] = %{{.+}} to %{{.+}} step %c16
// CHECK:           vector.load %[[ROWS]][%[[J0]], %{{.+}}] : memref<40x20xf32, strided<[20, 1]>>, vector<16xf32>
// CHECK:           vector.shuffle
// CHECK:           memref.load %[[X]][%{{.+}}, %{{.+}}] : memref<1x20xf32>
// CHECK:           memref.store %{{.+}}, %[[ACC]][%{{.+}}, %[[J0]]]
// CHECK:         return
func.func @linear(%x: memref<1x20xf32>, %w: memref<20x40xf32, strided<[1, 20]>>, %acc: memref<1x40xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<1x20xf32>, memref<20x40xf32, strided<[1, 20]>>) outs(%acc : memref<1x40xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A matmul marked kina.one_row_at_a_time (split-k's chunks) reads its rhs one row at a
// time, with the prefetches, and no loop reading several rows side by side is built: no
// run-time choice between the two (the `arith.andi` of the row length and gap tests).
#ch_lhs = affine_map<(b, i, k, j) -> (b, i, k)>
#ch_rhs = affine_map<(b, i, k, j) -> (b, k, j)>
#ch_out = affine_map<(b, i, k, j) -> (b, i, j)>
// CHECK-LABEL: func.func @one_row_at_a_time(
// CHECK-NOT:     arith.andi
// CHECK:         memref.prefetch
// CHECK-NOT:     arith.andi
// CHECK:         return
func.func @one_row_at_a_time(%x: memref<16x1x36xf32>, %w: memref<16x36x512xf32, strided<[?, ?, 1], offset: ?>>,
                             %p: memref<16x1x512xf32>) {
  linalg.generic {indexing_maps = [#ch_lhs, #ch_rhs, #ch_out], iterator_types = ["parallel", "parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<16x1x36xf32>, memref<16x36x512xf32, strided<[?, ?, 1], offset: ?>>) outs(%p : memref<16x1x512xf32>)
      attrs = {kina.one_row_at_a_time} {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}
