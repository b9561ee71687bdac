//! A lane's shared memory: two input slots and two output slots in one anonymous file
//! (`memfd`) that the router creates and the worker inherits, each mapping it.
//!
//! A batch uses the slots of `seq % 2`. A lane has at most two batches outstanding (the next
//! one is launched before the last one is read back), so each side touches a slot only while
//! the protocol gives it to that side: the router writes an input slot after the reply of the
//! batch that used it before (whose input the worker copied out on receipt), and the worker
//! writes an output slot after the router sent the batch after the one that used it (which
//! it sends only once it has copied that output out). The socket's system calls order the
//! memory accesses of the two processes.

use memmap2::{MmapOptions, MmapRaw};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

/// Sizes of one lane's slots, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub input_slot: usize,
    pub output_slot: usize,
}

impl Layout {
    /// Room for any batch of up to `max_tokens` tokens, and `output_slot` bytes of results
    /// (a larger result travels on the socket). Untouched pages take no memory.
    pub fn for_batches(max_tokens: usize, output_slot: usize) -> Self {
        Self {
            // ids, type ids and positions per token, and cu_seqlens (at most one per token, +1).
            input_slot: 16 * (max_tokens + 1),
            output_slot,
        }
    }

    fn total(&self) -> usize {
        2 * (self.input_slot + self.output_slot)
    }
}

/// The shared file, mapped. Split it into the halves each side uses ([`Region::split`]).
pub struct Region {
    map: Arc<MmapRaw>,
    layout: Layout,
}

impl Region {
    /// A new region and its file descriptor (close-on-exec: the spawner hands it to the worker
    /// explicitly).
    pub fn create(name: &str, layout: Layout) -> io::Result<(Self, OwnedFd)> {
        let name = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: `name` is a valid C string; the result is checked before use.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = File::from(fd.try_clone()?);
        file.set_len(layout.total() as u64)?;
        Ok((Self::map(&file, layout)?, fd))
    }

    /// The region whose descriptor the router handed over.
    pub fn open(fd: OwnedFd, layout: Layout) -> io::Result<Self> {
        let file = File::from(fd);
        let len = file.metadata()?.len() as usize;
        if len != layout.total() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shared region is {len} bytes, expected {}", layout.total()),
            ));
        }
        Self::map(&file, layout)
    }

    fn map(file: &File, layout: Layout) -> io::Result<Self> {
        let map = MmapOptions::new().len(layout.total()).map_raw(file)?;
        Ok(Self {
            map: Arc::new(map),
            layout,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn split(self) -> (Inputs, Outputs) {
        let base = 2 * self.layout.input_slot;
        (
            Inputs(Slots {
                map: self.map.clone(),
                offset: 0,
                size: self.layout.input_slot,
            }),
            Outputs(Slots {
                map: self.map,
                offset: base,
                size: self.layout.output_slot,
            }),
        )
    }
}

/// Two slots of one size at `offset` in the map.
struct Slots {
    map: Arc<MmapRaw>,
    offset: usize,
    size: usize,
}

impl Slots {
    /// Slot `seq % 2`, `len` bytes of it; `None` when `len` does not fit.
    fn get(&mut self, seq: u32, len: usize) -> Option<&mut [u8]> {
        if len > self.size {
            return None;
        }
        let start = self.offset + (seq as usize % 2) * self.size;
        // SAFETY: the range lies inside the map (its length is the layout's total). Inputs and
        // Outputs cover disjoint ranges and each is used through `&mut self` by one thread; the
        // other process touches a slot only when the protocol (module docs) gives it to it.
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(start), len) })
    }
}

/// The input slots: written by the router, read by the worker.
pub struct Inputs(Slots);

impl Inputs {
    pub fn slot(&mut self, seq: u32, len: usize) -> Option<&mut [u8]> {
        self.0.get(seq, len)
    }
}

/// The output slots: written by the worker, read by the router.
pub struct Outputs(Slots);

impl Outputs {
    pub fn slot(&mut self, seq: u32, len: usize) -> Option<&mut [u8]> {
        self.0.get(seq, len)
    }
}
