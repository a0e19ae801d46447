package fusefile

import "unsafe"

func unsafePointer(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
