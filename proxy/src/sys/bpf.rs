//! The `bpf(2)` map element commands on a map descriptor, for the few places
//! that must not go through aya: updates and deletes from any worker thread
//! without `&mut` (aya's writers need it, so they would need a lock), and the
//! capability probe that runs before aya is involved.
//!
//! Invariant (the callers' contract): `K` and `V` have exactly the key and
//! value sizes of the map behind `fd`; the kernel reads or writes that many
//! bytes through the pointers.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;

/// The head of `union bpf_attr` the element commands use.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn map_elem(
    cmd: libc::c_long,
    fd: BorrowedFd<'_>,
    key: u64,
    value: u64,
    flags: u64,
) -> io::Result<()> {
    let attr = MapElemAttr {
        map_fd: fd.as_raw_fd().unsigned_abs(),
        _pad: 0,
        key,
        value,
        flags,
    };
    // SAFETY: bpf(2) reads `size_of::<MapElemAttr>()` bytes of a valid attr;
    // the key/value addresses come from references the callers hold for the
    // whole call, of the map's key and value sizes (module invariant).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &attr as *const MapElemAttr,
            std::mem::size_of::<MapElemAttr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `BPF_MAP_LOOKUP_ELEM`: copies the value of `key` into `value`.
pub fn lookup<K, V>(fd: BorrowedFd<'_>, key: &K, value: &mut V) -> io::Result<()> {
    map_elem(
        BPF_MAP_LOOKUP_ELEM,
        fd,
        key as *const K as u64,
        value as *mut V as u64,
        0,
    )
}

/// `BPF_MAP_UPDATE_ELEM` with the given `BPF_*` flags.
pub fn update<K, V>(fd: BorrowedFd<'_>, key: &K, value: &V, flags: u64) -> io::Result<()> {
    map_elem(
        BPF_MAP_UPDATE_ELEM,
        fd,
        key as *const K as u64,
        value as *const V as u64,
        flags,
    )
}

/// `BPF_MAP_DELETE_ELEM`.
pub fn delete<K>(fd: BorrowedFd<'_>, key: &K) -> io::Result<()> {
    map_elem(BPF_MAP_DELETE_ELEM, fd, key as *const K as u64, 0, 0)
}
