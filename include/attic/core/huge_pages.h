// Transparent huge pages for the process's large allocations.
//
// KV moves through large, short-lived host buffers: a stored entry of a 2k-token turn of
// a 135M model is ~90 MB (serialized, read back from SSD, promoted). glibc serves each
// from a fresh mmap, so every use faults in ~22k 4-KiB pages; in a VM (nested paging)
// those faults cost more than the copy itself. With glibc's `glibc.malloc.hugetlb=1`
// tunable, malloc asks for transparent huge pages (madvise), cutting the faults 512x
// (measured: SSD-hit TTFT of a 2k-token session 540 -> 190 ms). Tunables are read only at
// process start, so this re-executes the program once with the tunable added.
#pragma once

#include <cstddef>
#include <memory>

namespace attic {

// `bytes` of zeroed memory that starts on a 2 MiB boundary, asked of the kernel as
// transparent huge pages (madvise) unless ATTIC_HUGE_PAGES=0; released when the last
// owner goes. Where the kernel refuses the mapping, the allocator's memory (zeroed, the
// same alignment, no huge-page request); aborts when there is none, as AlignedBuffer
// does. Null only for 0 bytes. For memory read as one long
// stream (the prepacked weights): glibc maps each allocation over its mmap threshold on
// its own, and one under 2 MiB (a 135M model's 1.7 MiB FFN matrices) can hold no huge
// page at all, so its stream pays a TLB miss every 4 KiB and the hardware prefetcher,
// which stops at 4 KiB page edges, starts over on every page.
std::shared_ptr<std::byte> AllocateHugePageAligned(size_t bytes);

// Call first thing in main(). Unless GLIBC_TUNABLES already names glibc.malloc.hugetlb,
// or ATTIC_HUGE_PAGES=0, or the kernel's THP mode is "never", re-executes
// /proc/self/exe with the same arguments and the tunable added; returns (doing nothing)
// when it does not or cannot.
void ReexecWithHugePageMalloc(char** argv);

}  // namespace attic
