// IR a pass cannot take: a diagnostic at the op it cannot handle, naming the pass,
// as mlir-opt gives one, and exit status 1 (never a traceback or an internal error).
// Each section is run alone (--split-input-file); the CHECK lines give each message.
// RUN: not kinac opt %s --split-input-file --passes abi 2>&1 | FileCheck %s
// RUN: not kinac opt %s --split-input-file --passes copies-to-linalg 2>&1 | FileCheck %s --check-prefix=COPY
// An upstream pipeline that fails on the input is reported the same way, with its own message:
// RUN: not kinac opt %s --split-input-file --passes deallocate 2>&1 | FileCheck %s --check-prefix=UPSTREAM

// CHECK: preconditions.mlir:[[@LINE+1]]:1: error: abi: cannot take a function over 'f32' scalars: 'scalars' must take and return ranked tensors only
func.func @scalars(%x: f32) -> f32 {
  return %x : f32
}

// -----

// CHECK: preconditions.mlir:[[@LINE+1]]:1: error: abi: cannot take a function over 'tensor<*xf32>' values
func.func @unranked(%x: tensor<*xf32>) -> tensor<*xf32> {
  return %x : tensor<*xf32>
}

// -----

// CHECK: preconditions.mlir:[[@LINE+1]]:1: error: abi: cannot take a function declaration: 'external' must have a body
func.func private @external(%x: tensor<4xf32>) -> tensor<4xf32>

// -----

func.func @callee(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
func.func @caller(%x: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: preconditions.mlir:[[@LINE+1]]:8: error: abi: cannot take a call of 'callee': its signature changes at the C boundary
  %y = func.call @callee(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// CHECK: preconditions.mlir:[[@LINE+1]]:1: error: abi: cannot rename 'f' to 'kina_f': that name is taken
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
func.func @kina_f(%x: memref<4xf32>) attributes {llvm.emit_c_interface} {
  return
}

// -----

func.func @copy_unranked(%a: memref<*xf32>, %b: memref<*xf32>) {
  // COPY: preconditions.mlir:[[@LINE+1]]:3: error: copies-to-linalg: cannot take a copy of 'memref<*xf32>': linalg.copy needs ranked memrefs
  memref.copy %a, %b : memref<*xf32> to memref<*xf32>
  return
}

// -----

func.func @leftover(%x: tensor<4xf32>) -> memref<4xf32> {
  // UPSTREAM: preconditions.mlir:[[@LINE+1]]:8: error: deallocate: failed to legalize operation 'bufferization.to_buffer'
  %m = bufferization.to_buffer %x : tensor<4xf32> to memref<4xf32>
  return %m : memref<4xf32>
}
