// RUN: kinac opt %s --passes matmul-loops | FileCheck %s
// RUN: kinac opt %s --passes 'matmul-loops{tile-rows=1 group-rows=1 register-row-bytes=0}' | FileCheck %s --check-prefix=ROWS

// Which loops matmul-loops gives each matmul (its choice, kina.ir.passes.matmul_loops.choose),
// stamped on the outermost loops it emits as kina.matmul_strategy. By default: many rows
// in register tiles, a few static rows together, a short static row's sums in registers,
// a long row unroll-and-jammed (one row at a time instead where rhs rows turn out short
// and back to back, at run time), split-k's chunks one row at a time, a transposed rhs as
// dot products of rows, and a fused copy behind its own test. With tiles, groups and
// registers turned off, every plain row goes by unroll-and-jam.

#lhs = affine_map<(i, k, j) -> (i, k)>
#rhs = affine_map<(i, k, j) -> (k, j)>
#out = affine_map<(i, k, j) -> (i, j)>

// CHECK-LABEL: func.func @prefill(
// CHECK:         kina.matmul_strategy = "register-tiles"
// ROWS-LABEL:  func.func @prefill(
// ROWS:          kina.matmul_strategy = "unroll-and-jam"
func.func @prefill(%x: memref<9x16xf32>, %w: memref<16x100xf32>, %acc: memref<9x100xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<9x16xf32>, memref<16x100xf32>) outs(%acc : memref<9x100xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// CHECK-LABEL: func.func @query_group(
// CHECK:         kina.matmul_strategy = "group-rows"
// ROWS-LABEL:  func.func @query_group(
// ROWS:          kina.matmul_strategy = "unroll-and-jam"
func.func @query_group(%q: memref<2x16xf32>, %k: memref<16x40xf32>, %acc: memref<2x40xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%q, %k : memref<2x16xf32>, memref<16x40xf32>) outs(%acc : memref<2x40xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A row of 64 floats is four 64-byte lines, within register-row-bytes (512).
// CHECK-LABEL: func.func @head_values(
// CHECK:         kina.matmul_strategy = "rows-in-registers"
// ROWS-LABEL:  func.func @head_values(
// ROWS:          kina.matmul_strategy = "unroll-and-jam"
func.func @head_values(%p: memref<1x16xf32>, %v: memref<16x64xf32>, %acc: memref<1x64xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%p, %v : memref<1x16xf32>, memref<16x64xf32>) outs(%acc : memref<1x64xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A row of 160 floats is ten lines, more than register-row-bytes holds.
// CHECK-LABEL: func.func @decode_row(
// CHECK:         kina.matmul_strategy = "unroll-and-jam"
func.func @decode_row(%x: memref<1x16xf32>, %w: memref<16x160xf32>, %acc: memref<1x160xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<1x16xf32>, memref<16x160xf32>) outs(%acc : memref<1x160xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// A chunk of split-k's, marked by that pass: its rhs rows are a weight's, back to back.
// CHECK-LABEL: func.func @chunk(
// CHECK:         kina.matmul_strategy = "row-at-a-time"
// ROWS-LABEL:  func.func @chunk(
// ROWS:          kina.matmul_strategy = "row-at-a-time"
func.func @chunk(%x: memref<1x16xf32>, %w: memref<16x40xf32>, %acc: memref<1x40xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %w : memref<1x16xf32>, memref<16x40xf32>) outs(%acc : memref<1x40xf32>) attrs = {kina.one_row_at_a_time} {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// rhs runs along k (a transposed view of a [64, 16] table): dot products of rows.
// CHECK-LABEL: func.func @tied_head(
// CHECK:         kina.matmul_strategy = "dot-rows"
// ROWS-LABEL:  func.func @tied_head(
// ROWS:          kina.matmul_strategy = "dot-rows"
func.func @tied_head(%x: memref<1x16xf32>, %t: memref<16x64xf32, strided<[1, 16]>>, %acc: memref<1x64xf32>) {
  linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%x, %t : memref<1x16xf32>, memref<16x64xf32, strided<[1, 16]>>) outs(%acc : memref<1x64xf32>) {
  ^bb0(%a: f32, %b: f32, %s: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.addf %s, %m : f32
    linalg.yield %r : f32
  }
  return
}

// fuse-concat-matmul's form: the matmul also copies rhs into a concat's slot.
// CHECK-LABEL: func.func @appended(
// CHECK:         kina.matmul_strategy = "fused-copy"
// ROWS-LABEL:  func.func @appended(
// ROWS:          kina.matmul_strategy = "fused-copy"
func.func @appended(%q: memref<1x4xf32>, %a: memref<4x64xf32, strided<[?, 1], offset: ?>>, %acc: memref<1x64xf32>, %slot: memref<4x64xf32, strided<[?, 1], offset: ?>>) {
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
