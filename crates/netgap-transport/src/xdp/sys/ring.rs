//! The ring operations on a port's four rings, in Rust: the same loads,
//! stores and orderings as libxdp's inline functions of `<xdp/xsk.h>`
//! (the kernel's side is `net/xdp/xsk_queue.h`), over the layout libxdp
//! fills in for a socket it makes and `handed.rs` fills in for a handed
//! one. Plain memory operations, no library: a program that only maps a
//! handed socket (the preload library's direct connections) links no
//! libxdp or libbpf.

use std::sync::atomic::{AtomicU32, Ordering};

use super::{Ring, XdpDesc};

/// `XDP_RING_NEED_WAKEUP`: the ring's flags word asks for a wake-up.
const XDP_RING_NEED_WAKEUP: u32 = 1 << 0;

/// The shared index or flags word at `at`, for atomic access.
///
/// # Safety
///
/// `at` points into a live ring mapping, at an aligned u32 the kernel
/// shares with this process.
unsafe fn shared<'a>(at: *mut u32) -> &'a AtomicU32 {
    // SAFETY: the caller's contract; the kernel accesses the word only
    // atomically, as this side does.
    unsafe { AtomicU32::from_ptr(at) }
}

impl Ring {
    /// Reserves `nb` entries of a producer ring (fill, TX): `nb` with the
    /// first one's index in `idx`, or 0 when fewer are free
    /// (`xsk_ring_prod__reserve`).
    ///
    /// # Safety
    ///
    /// The ring is mapped (made by libxdp, or mapped from a handed
    /// socket) for as long as `self`.
    pub(super) unsafe fn reserve(&mut self, nb: u32, idx: &mut u32) -> u32 {
        let mut free = self.cached_cons.wrapping_sub(self.cached_prod);
        if free < nb {
            // `cached_cons` is kept a ring's size ahead of the consumer,
            // so the free entries are one subtraction on the usual path.
            // SAFETY: the caller's contract.
            let cons = unsafe { shared(self.consumer) }.load(Ordering::Acquire);
            self.cached_cons = cons.wrapping_add(self.size);
            free = self.cached_cons.wrapping_sub(self.cached_prod);
        }
        if free < nb {
            return 0;
        }
        *idx = self.cached_prod;
        self.cached_prod = self.cached_prod.wrapping_add(nb);
        nb
    }

    /// Hands the kernel the next `nb` entries of a producer ring, written
    /// before this call (`xsk_ring_prod__submit`).
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`]; the entries were reserved.
    pub(super) unsafe fn submit(&mut self, nb: u32) {
        // SAFETY: the caller's contract.
        let producer = unsafe { shared(self.producer) };
        // Only this side writes the producer index; the release store
        // makes the entries visible to the kernel before the index.
        let at = producer.load(Ordering::Relaxed);
        producer.store(at.wrapping_add(nb), Ordering::Release);
    }

    /// Up to `nb` entries of a consumer ring (RX, completion) the kernel
    /// produced: how many, with the first one's index in `idx`
    /// (`xsk_ring_cons__peek`).
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`].
    pub(super) unsafe fn peek(&mut self, nb: u32, idx: &mut u32) -> u32 {
        // SAFETY: the caller's contract.
        let entries = unsafe { self.available(nb) };
        if entries > 0 {
            *idx = self.cached_cons;
            self.cached_cons = self.cached_cons.wrapping_add(entries);
        }
        entries
    }

    /// Gives the next `nb` entries of a consumer ring back to the kernel,
    /// read before this call (`xsk_ring_cons__release`).
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`]; the entries were peeked.
    pub(super) unsafe fn release(&mut self, nb: u32) {
        // SAFETY: the caller's contract.
        let consumer = unsafe { shared(self.consumer) };
        // Only this side writes the consumer index; the release store
        // orders the entries' reads before the kernel may reuse them.
        let at = consumer.load(Ordering::Relaxed);
        consumer.store(at.wrapping_add(nb), Ordering::Release);
    }

    /// Whether a consumer ring holds an entry: one load of the producer
    /// index when the cached view is empty, no system call (a poll-mode
    /// waiter's cheap look before a whole pump).
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`].
    pub(super) unsafe fn ready(&mut self) -> bool {
        // SAFETY: the caller's contract.
        unsafe { self.available(1) > 0 }
    }

    /// Entries a consumer ring holds, at most `nb`, reading the
    /// producer index only when the cached view is empty
    /// (`xsk_cons_nb_avail`).
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`].
    unsafe fn available(&mut self, nb: u32) -> u32 {
        let mut entries = self.cached_prod.wrapping_sub(self.cached_cons);
        if entries == 0 {
            // SAFETY: the caller's contract.
            self.cached_prod = unsafe { shared(self.producer) }.load(Ordering::Acquire);
            entries = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        entries.min(nb)
    }

    /// Whether the kernel asks for a wake-up to take a producer ring's
    /// entries (`xsk_ring_prod__needs_wakeup`).
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`].
    pub(super) unsafe fn needs_wakeup(&self) -> bool {
        // SAFETY: the caller's contract.
        unsafe { shared(self.flags) }.load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }

    /// The fill ring's entry `idx`: the UMEM address of a frame to fill.
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`], on a ring of `u64` entries.
    pub(super) unsafe fn fill_addr(&mut self, idx: u32) -> *mut u64 {
        // SAFETY: `idx & mask` is below the ring's size, and the ring's
        // mapping holds that many entries.
        unsafe { self.ring.cast::<u64>().add((idx & self.mask) as usize) }
    }

    /// The completion ring's entry `idx`: the UMEM address of a frame sent.
    ///
    /// # Safety
    ///
    /// As for [`Ring::fill_addr`].
    pub(super) unsafe fn comp_addr(&self, idx: u32) -> *const u64 {
        // SAFETY: as in `fill_addr`.
        unsafe { self.ring.cast::<u64>().add((idx & self.mask) as usize) }
    }

    /// The TX ring's descriptor `idx`.
    ///
    /// # Safety
    ///
    /// As for [`Ring::reserve`], on a ring of descriptors.
    pub(super) unsafe fn tx_desc(&mut self, idx: u32) -> *mut XdpDesc {
        // SAFETY: as in `fill_addr`.
        unsafe { self.ring.cast::<XdpDesc>().add((idx & self.mask) as usize) }
    }

    /// The RX ring's descriptor `idx`.
    ///
    /// # Safety
    ///
    /// As for [`Ring::tx_desc`].
    pub(super) unsafe fn rx_desc(&self, idx: u32) -> *const XdpDesc {
        // SAFETY: as in `fill_addr`.
        unsafe { self.ring.cast::<XdpDesc>().add((idx & self.mask) as usize) }
    }
}
