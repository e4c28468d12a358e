//! A fault-injecting redb [`StorageBackend`] that models a disk, for crash tests.
//!
//! Self-contained (std + redb only), so fuzz targets and tools can include it by path.
//!
//! The disk keeps two images, as redb's own crash tests do:
//! - `live`: every write and length change, as the process sees the file (the page cache);
//! - `durable`: what the last completed `sync_data` made permanent.
//!
//! Everything written since the last completed sync is *pending*. A simulated power cut
//! keeps, drops or half-applies each pending write (torn at 512-byte sector granularity,
//! each sector of a torn write landing or not independently), in any combination: the
//! disk may reorder unsynced writes. A process crash without power loss keeps `live`.
//!
//! Faults: the Nth write, set_len or sync from the moment a [`Trigger`] is armed fails
//! with `EIO` or `ENOSPC`, once or from then on, or the power is cut at that moment (the
//! operation does not happen and every later one fails: the process is dead). A failed
//! sync makes nothing durable; its pending writes stay pending, as Linux may have dropped
//! them from the page cache (the "fsyncgate" behaviour).
#![allow(dead_code)]

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::StorageBackend;

/// The sector size at which a torn write tears.
pub const SECTOR: u64 = 512;

/// Linux `EIO`.
pub const EIO: i32 = 5;
/// Linux `ENOSPC`.
pub const ENOSPC: i32 = 28;

/// The kinds of backend operation a trigger counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// `write`.
    Write,
    /// `set_len`.
    SetLen,
    /// `sync_data`.
    Sync,
}

impl IoKind {
    fn index(self) -> usize {
        match self {
            IoKind::Write => 0,
            IoKind::SetLen => 1,
            IoKind::Sync => 2,
        }
    }
}

/// What happens when a trigger fires.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The operation fails with this errno (`EIO` or `ENOSPC`) and does nothing. With
    /// `persistent`, every later operation of the same kind fails too.
    Fail {
        /// The raw OS error.
        errno: i32,
        /// Whether it keeps failing.
        persistent: bool,
    },
    /// The power is cut just before the operation: it does not happen, and nothing after it
    /// reaches the disk.
    PowerCut,
}

/// Fire `action` at the `nth` (1-based) operation of `kind` counted from arming.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    /// Which operations are counted.
    pub kind: IoKind,
    /// Which one fires (1 = the next one).
    pub nth: u64,
    /// What happens.
    pub action: FaultAction,
}

/// How a power cut treats the writes pending since the last completed sync.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CutPolicy {
    /// Every pending write reached the platter (a process crash loses nothing either).
    KeepAll,
    /// None did.
    DropAll,
    /// Each independently: kept, dropped or torn (sector by sector).
    Random,
}

#[derive(Clone, Debug)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

/// Counters, for the figures a long run reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Writes that reached the live image.
    pub writes: u64,
    /// Length changes that reached the live image.
    pub set_lens: u64,
    /// Completed syncs.
    pub syncs: u64,
    /// Faults injected (failed operations and power cuts).
    pub faults: u64,
    /// Operations attempted after a fault fired on this disk (a poisoned handle should
    /// attempt no sync).
    pub syncs_after_fault: u64,
}

#[derive(Debug, Default)]
struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    counts: [u64; 3],
    trigger: Option<Trigger>,
    /// Kinds that fail from now on, with their errno.
    failing: [Option<i32>; 3],
    /// The power is off (or the process is dead): nothing reaches the disk any more.
    dead: bool,
    fired: bool,
    stats: DiskStats,
}

/// The simulated disk, shared by every backend opened on it (cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct FaultDisk {
    state: Arc<Mutex<State>>,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn apply_write(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    let end = start.saturating_add(data.len());
    if end > image.len() {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

fn set_len(image: &mut Vec<u8>, len: u64) {
    image.resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
}

impl FaultDisk {
    /// An empty disk.
    pub fn new() -> FaultDisk {
        FaultDisk::default()
    }

    /// A disk whose live and durable images are `image` (what a reboot finds).
    pub fn from_image(image: Vec<u8>) -> FaultDisk {
        let disk = FaultDisk::default();
        {
            let mut s = disk.lock();
            s.live = image.clone();
            s.durable = image;
        }
        disk
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A backend to hand to redb.
    pub fn backend(&self) -> FaultBackend {
        FaultBackend { disk: self.clone() }
    }

    /// Arms `trigger` (replacing any armed one); counting starts now.
    pub fn arm(&self, trigger: Trigger) {
        let mut s = self.lock();
        s.counts = [0; 3];
        s.trigger = Some(trigger);
    }

    /// Disarms the trigger and heals persistent failures (the disk was replaced).
    pub fn heal(&self) {
        let mut s = self.lock();
        s.trigger = None;
        s.failing = [None; 3];
    }

    /// Whether a trigger fired (or the power was cut) on this disk.
    pub fn fired(&self) -> bool {
        self.lock().fired
    }

    /// Whether the disk is dead (power cut or process killed).
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Cuts the power now (between operations): nothing reaches the disk any more.
    pub fn cut(&self) {
        let mut s = self.lock();
        s.dead = true;
    }

    /// The counters.
    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// The live image (what the process wrote; survives a process crash).
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    /// The durable image (what completed syncs made permanent).
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// Writes and length changes pending since the last completed sync.
    pub fn pending_ops(&self) -> usize {
        self.lock().pending.len()
    }

    /// What the disk holds after a power cut: the durable image plus the pending writes
    /// that `policy` lets through. `rng` supplies randomness (any 64-bit generator).
    pub fn power_cut_image(&self, policy: CutPolicy, rng: &mut dyn FnMut() -> u64) -> Vec<u8> {
        let s = self.lock();
        let mut image = s.durable.clone();
        for p in &s.pending {
            let choice = match policy {
                CutPolicy::KeepAll => 0,
                CutPolicy::DropAll => 1,
                CutPolicy::Random => rng() % 3,
            };
            match (p, choice) {
                (_, 1) => {}
                (Pending::SetLen(len), _) => set_len(&mut image, *len),
                (Pending::Write { offset, data }, 0) => apply_write(&mut image, *offset, data),
                (Pending::Write { offset, data }, _) => {
                    // Torn: each 512-byte sector (aligned to the file) lands or not.
                    let end = offset + data.len() as u64;
                    let mut at = *offset;
                    while at < end {
                        let sector_end = ((at / SECTOR) + 1) * SECTOR;
                        let chunk_end = sector_end.min(end);
                        if rng().is_multiple_of(2) {
                            let from = (at - offset) as usize;
                            let to = (chunk_end - offset) as usize;
                            apply_write(&mut image, at, &data[from..to]);
                        }
                        at = chunk_end;
                    }
                }
            }
        }
        image
    }

    /// Counts an operation of `kind` and decides its fate: `Ok(())` to perform it.
    fn admit(&self, s: &mut State, kind: IoKind) -> io::Result<()> {
        if s.dead {
            if kind == IoKind::Sync {
                s.stats.syncs_after_fault += 1;
            }
            return Err(errno(EIO));
        }
        if s.fired && kind == IoKind::Sync {
            s.stats.syncs_after_fault += 1;
        }
        if let Some(code) = s.failing[kind.index()] {
            s.stats.faults += 1;
            return Err(errno(code));
        }
        s.counts[kind.index()] += 1;
        if let Some(t) = s.trigger
            && t.kind == kind
            && s.counts[kind.index()] >= t.nth
        {
            s.trigger = None;
            s.fired = true;
            s.stats.faults += 1;
            match t.action {
                FaultAction::Fail {
                    errno: code,
                    persistent,
                } => {
                    if persistent {
                        s.failing[kind.index()] = Some(code);
                    }
                    return Err(errno(code));
                }
                FaultAction::PowerCut => {
                    s.dead = true;
                    return Err(errno(EIO));
                }
            }
        }
        Ok(())
    }
}

/// The [`StorageBackend`] over a [`FaultDisk`]. It implements no locks (redb then allows
/// only `ConcurrencyMode::ExclusiveWriter`, which `open_backend` uses).
#[derive(Debug)]
pub struct FaultBackend {
    disk: FaultDisk,
}

impl StorageBackend for FaultBackend {
    fn len(&self) -> Result<u64, io::Error> {
        let s = self.disk.lock();
        if s.dead {
            return Err(errno(EIO));
        }
        Ok(s.live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.disk.lock();
        if s.dead {
            return Err(errno(EIO));
        }
        let start = usize::try_from(offset).map_err(|_| errno(EIO))?;
        let end = start
            .checked_add(out.len())
            .filter(|e| *e <= s.live.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(&s.live[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut s = self.disk.lock();
        self.disk.admit(&mut s, IoKind::SetLen)?;
        set_len(&mut s.live, len);
        s.pending.push(Pending::SetLen(len));
        s.stats.set_lens += 1;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut s = self.disk.lock();
        self.disk.admit(&mut s, IoKind::Sync)?;
        s.durable = s.live.clone();
        s.pending.clear();
        s.stats.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut s = self.disk.lock();
        self.disk.admit(&mut s, IoKind::Write)?;
        apply_write(&mut s.live, offset, data);
        s.pending.push(Pending::Write {
            offset,
            data: data.to_vec(),
        });
        s.stats.writes += 1;
        Ok(())
    }
}
