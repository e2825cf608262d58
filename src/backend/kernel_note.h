// The kernel a backend op chose, named for the tracer. A backend that picks among kernels inside
// an op (the CPU backend's MatMul table: gemv, tiled GEMM, integer dot, ...) calls NoteKernel on
// the calling thread when it has chosen; the TracingBackend clears the note before the op and
// reads it after, into the op span's "kernel" argument and the profile's per-kernel rows.
//
// The first note after a clear wins, so an op that runs others inside (MoeExperts' MatMuls, a
// fallback to the reference loops) names itself by noting before it delegates. Names are static
// text; `variant` (a function, called only when the note is read) adds what varies at run time
// (the Highway target, the integer-dot instruction path). With tracing off, a note costs a
// thread-local load and a branch: nothing clears it, so after the first one nothing is stored.
#pragma once

namespace dh {

struct KernelNote {
  const char* name = nullptr;             // nullptr: the op named no kernel
  const char* (*variant)() = nullptr;     // optional
};

namespace kernel_note_internal {
inline constinit thread_local KernelNote note{};
}  // namespace kernel_note_internal

inline void NoteKernel(const char* name, const char* (*variant)() = nullptr) {
  KernelNote& n = kernel_note_internal::note;
  if (n.name == nullptr) n = {name, variant};
}

// Returns the note of this thread and clears it.
inline KernelNote TakeKernelNote() {
  KernelNote n = kernel_note_internal::note;
  kernel_note_internal::note = {};
  return n;
}

}  // namespace dh
