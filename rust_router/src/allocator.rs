//! The C allocator's own statistics, as `te_allocator_*` gauges on `/metrics`.
//!
//! The router runs inside a Python process, and the process's resident memory mixes the
//! interpreter, torch, the tokenizers and the router, all allocating through glibc's malloc.
//! A growing RSS alone does not say whether something leaks (bytes allocated and never freed:
//! the in-use figure grows) or the allocator holds freed memory it cannot give back
//! (fragmentation, one arena per busy thread: the free figure and the arena count grow while
//! the in-use figure stays). glibc's `mallinfo2()` and `malloc_info()` tell the two apart, so
//! they are read at every scrape (not stored in the registry: always current, nothing to
//! update on the request path).
//!
//! Linux with glibc only; elsewhere nothing is rendered. Memory that does not come from
//! malloc (Python's small-object arenas, thread stacks, the files mapped in) is not here: it
//! is the rest of the process's `RssAnon`/`RssFile`.
//!
//! Cost: both calls lock each arena in turn and walk its free lists (a thread that allocates
//! from that arena meanwhile waits); a whole scrape took under a millisecond during the soak
//! (`benchmarks/soak_memory.py`). Once per scrape, every few seconds at most, that is nothing.
//!
//! The one allocator setting the router changes is here too: [`bound_fragmentation`] fixes
//! malloc's mmap threshold at start, which keeps a CPU model's activations from growing the
//! memory malloc holds free without bound.

use std::fmt::Write;

/// One reading of the allocator's totals, over all its arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Arenas: the main one plus one per thread that found the others locked when it
    /// allocated, up to `MALLOC_ARENA_MAX` (by default 8 per core).
    pub arenas: usize,
    /// Bytes the arenas took from the OS, in use or free (`mallinfo2().arena`).
    pub arena_bytes: usize,
    /// Bytes in live allocations: in the arenas plus the large ones with a mapping of their
    /// own (`uordblks + hblkhd`). Chunks in the per-thread caches count as in use (a few
    /// hundred KiB at most per thread).
    pub in_use_bytes: usize,
    /// Bytes free inside the arenas, held rather than returned to the OS (`fordblks`).
    pub free_bytes: usize,
    /// Of the in-use bytes, those in allocations with a mapping of their own (`hblkhd`),
    /// which go back to the OS as soon as they are freed.
    pub mmap_bytes: usize,
}

/// `(name, help, value)` of each gauge, in the order they are rendered.
pub(crate) fn gauges(s: &Stats) -> [(&'static str, &'static str, usize); 5] {
    [
        (
            "te_allocator_arenas",
            "malloc arenas (glibc adds one for each thread that finds the others busy, up to MALLOC_ARENA_MAX).",
            s.arenas,
        ),
        (
            "te_allocator_arena_bytes",
            "Bytes malloc's arenas took from the OS, in use or free (mallinfo2 arena).",
            s.arena_bytes,
        ),
        (
            "te_allocator_in_use_bytes",
            "Bytes in live malloc allocations, arenas and own mappings together (mallinfo2 uordblks + hblkhd); steady growth under a steady load is a leak.",
            s.in_use_bytes,
        ),
        (
            "te_allocator_free_bytes",
            "Bytes free inside malloc's arenas, held rather than returned to the OS (mallinfo2 fordblks): fragmentation, not a leak.",
            s.free_bytes,
        ),
        (
            "te_allocator_mmap_bytes",
            "Of the in-use bytes, those in large allocations with a mapping of their own, returned to the OS when freed (mallinfo2 hblkhd).",
            s.mmap_bytes,
        ),
    ]
}

/// Appends the gauges to a Prometheus text exposition (nothing where there are no
/// statistics: not glibc, or a glibc older than 2.33).
pub fn render(out: &mut String) {
    let Some(stats) = stats() else { return };
    for (name, help, value) in gauges(&stats) {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
}

/// The allocator's totals now, or `None` where they cannot be read.
pub fn stats() -> Option<Stats> {
    imp::stats()
}

/// From this size up, malloc gives an allocation a mapping of its own, unmapped when it is
/// freed (see [`bound_fragmentation`]).
pub const MMAP_THRESHOLD: usize = 1 << 20;

/// What [`bound_fragmentation`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threshold {
    /// Fixed at this many bytes.
    Fixed(usize),
    /// Left as the environment set it (`MALLOC_MMAP_THRESHOLD_`, `GLIBC_TUNABLES`).
    FromEnvironment,
    /// Not glibc.
    Unsupported,
}

/// Fixes malloc's mmap threshold at [`MMAP_THRESHOLD`], unless the environment chose one;
/// called once at start, before the model loads.
///
/// glibc starts the threshold at 128 KiB and raises it to the size of every mapped block
/// that is freed, up to 32 MiB. On a CPU the model's activations are blocks of a few MiB
/// whose sizes change with every batch; once the threshold has passed them they come from
/// the arenas, where the holes one batch leaves fit the next batch's sizes only in part, and
/// the free memory the arenas hold grew without bound: 1 GiB after 300 random batches of
/// all-MiniLM-L6-v2 and still rising, about 10 MiB with the threshold fixed at 1 MiB
/// (`benchmarks/soak_backend.py`; through HTTP, `benchmarks/soak_memory.py`; figures in
/// docs/journal/results-log.md). A fixed threshold also stops glibc from raising it. Each large
/// block then costs a mapping and its page faults, a few percent of a CPU batch's time,
/// nothing a GPU's host side notices (its large blocks are the CUDA allocator's).
///
/// `MALLOC_MMAP_THRESHOLD_=<bytes>` (or `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...`)
/// chooses another value: glibc applied it when the process started, and it is kept.
pub fn bound_fragmentation() -> Threshold {
    let chosen = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("mmap_threshold"));
    if chosen {
        return Threshold::FromEnvironment;
    }
    imp::set_mmap_threshold(MMAP_THRESHOLD)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use super::{Stats, Threshold};
    use std::sync::OnceLock;

    type Mallinfo2 = unsafe extern "C" fn() -> libc::mallinfo2;

    /// `mallinfo2`, looked up at run time rather than linked: it is from glibc 2.33, and a
    /// linked symbol would raise the whole wheel's glibc floor (its manylinux tag) for a
    /// metric. On an older glibc the gauges are simply absent. (`mallinfo`, the old call,
    /// reports in `int`s that wrap past 2 GiB: worse than nothing on a large model's heap.)
    fn mallinfo2() -> Option<Mallinfo2> {
        static FOUND: OnceLock<Option<Mallinfo2>> = OnceLock::new();
        *FOUND.get_or_init(|| {
            // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the loaded objects.
            let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr()) };
            // SAFETY: glibc's `mallinfo2` has exactly this signature.
            (!sym.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Mallinfo2>(sym) })
        })
    }

    /// Arenas in `malloc_info()`'s XML report (one `<heap nr=...>` each); `mallinfo2` has
    /// only totals.
    fn arena_count() -> Option<usize> {
        let mut buf: *mut libc::c_char = std::ptr::null_mut();
        let mut len: libc::size_t = 0;
        // SAFETY: `open_memstream` writes the buffer's address and length at fclose, and the
        // buffer is then ours to read and free.
        unsafe {
            let stream = libc::open_memstream(&mut buf, &mut len);
            if stream.is_null() {
                return None;
            }
            let rc = libc::malloc_info(0, stream);
            libc::fclose(stream);
            if buf.is_null() {
                return None;
            }
            let text = std::slice::from_raw_parts(buf.cast::<u8>(), len);
            let heaps = text.windows(9).filter(|w| w == b"<heap nr=").count();
            libc::free(buf.cast());
            (rc == 0 && heaps > 0).then_some(heaps)
        }
    }

    pub fn set_mmap_threshold(bytes: usize) -> Threshold {
        let value = libc::c_int::try_from(bytes).expect("a threshold below 2 GiB");
        // SAFETY: mallopt takes plain integers and may be called at any time.
        match unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, value) } {
            1 => Threshold::Fixed(bytes),
            _ => Threshold::Unsupported,
        }
    }

    pub fn stats() -> Option<Stats> {
        // SAFETY: takes no arguments and only reads the allocator's state under its locks.
        let m = unsafe { mallinfo2()?() };
        Some(Stats {
            arenas: arena_count()?,
            arena_bytes: m.arena,
            in_use_bytes: m.uordblks + m.hblkhd,
            free_bytes: m.fordblks,
            mmap_bytes: m.hblkhd,
        })
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub fn stats() -> Option<super::Stats> {
        None
    }

    pub fn set_mmap_threshold(_: usize) -> super::Threshold {
        super::Threshold::Unsupported
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;
    use std::hint::black_box;

    #[test]
    fn a_live_allocation_shows_as_in_use_and_mapped() {
        const SIZE: usize = 256 << 20;
        // Large enough for a mapping of its own whatever the dynamic mmap threshold has
        // grown to (at most 32 MiB on 64-bit), and for no other test to hide it.
        // black_box: unobserved, the allocation would be optimized away.
        let block = black_box(vec![1u8; SIZE]);
        let s = stats().expect("glibc >= 2.33");
        assert!(s.mmap_bytes >= SIZE, "{s:?}");
        assert!(s.in_use_bytes >= SIZE, "{s:?}");
        drop(block);
    }

    /// Whether glibc gave `block` a mapping of its own: the IS_MMAPPED bit (2) of the chunk
    /// size glibc keeps in the word before the block.
    fn has_own_mapping(block: &[u8]) -> bool {
        // SAFETY: a malloc'd block of glibc's: its chunk header precedes it.
        unsafe { *block.as_ptr().cast::<usize>().sub(1) & 2 != 0 }
    }

    #[test]
    fn blocks_from_the_fixed_threshold_up_are_mapped_after_larger_ones_were_freed() {
        // A freed 24 MiB block raises glibc's dynamic threshold past 4 MiB: the next 4 MiB
        // block would come from an arena and stay there once freed.
        drop(black_box(vec![1u8; 24 << 20]));
        let threshold = bound_fragmentation();
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            assert_eq!(threshold, Threshold::Fixed(MMAP_THRESHOLD));
        }
        assert!(has_own_mapping(&black_box(vec![1u8; 4 * MMAP_THRESHOLD])));
        assert!(!has_own_mapping(&black_box(vec![1u8; MMAP_THRESHOLD / 4])));
    }
}
