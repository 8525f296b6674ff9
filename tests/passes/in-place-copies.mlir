// RUN: kinac opt %s --passes in-place-copies | FileCheck %s

// A concat's prefix: a parameter copied into a view of an out-buffer. The caller may
// pass the same memory as both (a cache appended in place), so the copy runs only
// where they differ at run time: not the same first element, or not the same strides.
// CHECK-LABEL: func.func @kina_prefix(
// CHECK-SAME:    %[[PAST:[^:]+]]: memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>>, %[[OUT:[^:]+]]: memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>>, %[[S:[^:]+]]: index)
// CHECK:         %[[PREFIX:.+]] = memref.subview %[[OUT]][0, 0, 0] [3, 64, %[[S]]] [1, 1, 1]
// CHECK:         %{{[^,]+}}, %[[POFF:[^,]+]], %{{[^,]+}}, %[[PSTR:[^:]+]]:3 = memref.extract_strided_metadata %[[PAST]]
// CHECK:         %{{[^,]+}}, %[[DOFF:[^,]+]], %{{[^,]+}}, %[[DSTR:[^:]+]]:3 = memref.extract_strided_metadata %[[PREFIX]]
// CHECK:         %[[SAME0:.+]] = arith.cmpi eq, %{{.+}}, %{{.+}} : index
// CHECK:         arith.cmpi eq, %[[PSTR]]#0, %[[DSTR]]#0
// CHECK:         arith.cmpi eq, %[[PSTR]]#1, %[[DSTR]]#1
// CHECK:         arith.cmpi eq, %[[PSTR]]#2, %[[DSTR]]#2
// CHECK:         %[[SAME:.+]] = arith.andi
// CHECK:         %[[DIFFER:.+]] = arith.xori %[[SAME]], %{{.+}} : i1
// CHECK-NEXT:    scf.if %[[DIFFER]] {
// CHECK-NEXT:      linalg.copy {{.*}}ins(%[[PAST]] : {{.*}}) outs(%[[PREFIX]] : {{.*}})
// CHECK-NEXT:    }
// CHECK-NEXT:    return
func.func @kina_prefix(%past: memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>>, %out0: memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>>, %s: index) {
  %prefix = memref.subview %out0[0, 0, 0] [3, 64, %s] [1, 1, 1] : memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>> to memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>>
  linalg.copy ins(%past : memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>>) outs(%prefix : memref<3x64x?xf32, strided<[?, ?, 1], offset: ?>>)
  return
}

// A copy from or into a temporary is left as it is: the function's own buffers never
// alias a parameter.
// CHECK-LABEL: func.func @kina_temporaries(
// CHECK-NOT:     scf.if
// CHECK:         linalg.copy
// CHECK-NOT:     scf.if
// CHECK:         linalg.copy
// CHECK-NOT:     scf.if
// CHECK:         return
func.func @kina_temporaries(%x: memref<64xf32>, %out0: memref<64xf32>) {
  %t = memref.alloc() : memref<64xf32>
  linalg.copy ins(%x : memref<64xf32>) outs(%t : memref<64xf32>)
  linalg.copy ins(%t : memref<64xf32>) outs(%out0 : memref<64xf32>)
  memref.dealloc %t : memref<64xf32>
  return
}
