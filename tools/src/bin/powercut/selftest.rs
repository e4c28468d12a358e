//! cutfs checks itself before the runs: what a process reads through the mount is what it
//! wrote (writes, length changes, reads at random offsets, compared with a copy kept in
//! memory), and a power cut leaves exactly what was synced (`DropAll`), or everything
//! (`KeepAll`), file data and directory changes alike.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::Mounted;
use crate::cutfs::{CutPolicy, Shared};
use crate::driver::Rng;

/// A file as the process sees it and as it was at its last sync.
#[derive(Default, Clone)]
struct Shadow {
    live: Vec<u8>,
    durable: Vec<u8>,
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("sync {}: {e}", dir.display()))
}

fn io<T>(what: &str, r: std::io::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Random writes, length changes, reads and syncs on `f`, checked against `s`.
fn scramble(f: &File, s: &mut Shadow, rng: &mut Rng, steps: usize) -> Result<u64, String> {
    let mut checked = 0;
    for _ in 0..steps {
        match rng.below(10) {
            0..=4 => {
                let offset = rng.below(70_000) as usize;
                let len = 1 + rng.below(9_000) as usize;
                let byte = if rng.chance(20) {
                    0
                } else {
                    rng.next_u64() as u8
                };
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                io("write", f.write_all_at(&data, offset as u64))?;
                if s.live.len() < offset + len {
                    s.live.resize(offset + len, 0);
                }
                s.live[offset..offset + len].copy_from_slice(&data);
            }
            5 => {
                let len = rng.below(80_000) as usize;
                io("set_len", f.set_len(len as u64))?;
                s.live.resize(len, 0);
            }
            6 | 7 => {
                let offset = rng.below(s.live.len() as u64 + 100) as usize;
                let len = rng.below(20_000) as usize;
                let mut buf = vec![0u8; len];
                let mut done = 0;
                while done < len {
                    let n = io("read", f.read_at(&mut buf[done..], (offset + done) as u64))?;
                    if n == 0 {
                        break;
                    }
                    done += n;
                }
                let end = s.live.len().min(offset + len).max(offset);
                let want = s.live.get(offset..end).unwrap_or(&[]);
                if &buf[..done] != want {
                    return Err(format!(
                        "read of {len} bytes at {offset} gave {done} bytes that differ from what was written (file length {})",
                        s.live.len()
                    ));
                }
                checked += 1;
            }
            8 => {
                io("fdatasync", f.sync_data())?;
                s.durable.clone_from(&s.live);
            }
            _ => {
                let len = io("stat", f.metadata())?.len();
                if len != s.live.len() as u64 {
                    return Err(format!("stat says {len} bytes, {} written", s.live.len()));
                }
                checked += 1;
            }
        }
    }
    Ok(checked)
}

/// One round: files on a fresh mount, a cut with `policy`, then the backing directory
/// compared with what must be there.
fn round(seed: u64, policy: CutPolicy) -> Result<u64, String> {
    let mut rng = Rng::new(seed);
    let dir = io("temporary directory", tempfile::tempdir())?;
    let backing = dir.path().join("backing");
    let mnt = dir.path().join("mnt");
    io("mkdir", std::fs::create_dir(&backing))?;
    io("mkdir", std::fs::create_dir(&mnt))?;
    let shared = Arc::new(io("cutfs", Shared::new(&backing, Box::new(|| {})))?);
    let mut mounted = io("mount", Mounted::mount(&shared, &mnt))?;
    let open = |name: &str| {
        io(
            name,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(mnt.join(name)),
        )
    };
    let mut files: BTreeMap<&str, Shadow> = BTreeMap::new();
    // `a`: created, its name synced, then scrambled (its data synced now and then).
    let a = open("a")?;
    sync_dir(&mnt)?;
    let mut checked = scramble(&a, files.entry("a").or_default(), &mut rng, 600)?;
    // `c`: data and name synced; then linked as `d` and renamed to `e`, synced.
    let c = open("c")?;
    checked += scramble(&c, files.entry("c").or_default(), &mut rng, 50)?;
    io("fdatasync c", c.sync_data())?;
    sync_dir(&mnt)?;
    io("link", std::fs::hard_link(mnt.join("c"), mnt.join("d")))?;
    io("rename", std::fs::rename(mnt.join("c"), mnt.join("e")))?;
    sync_dir(&mnt)?;
    // Not synced: the unlink of `a` (it comes back), and the name of `b`, whose data is
    // synced (it vanishes).
    io("unlink", std::fs::remove_file(mnt.join("a")))?;
    let b = open("b")?;
    checked += scramble(&b, files.entry("b").or_default(), &mut rng, 50)?;
    io("fdatasync b", b.sync_data())?;
    if let Some(s) = files.get_mut("b") {
        s.durable.clone_from(&s.live);
    }
    if let Some(s) = files.get_mut("c") {
        s.durable.clone_from(&s.live);
    }
    let cshadow = files["c"].clone();
    shared
        .cut(policy, &mut || rng.next_u64())
        .map_err(|e| format!("cut: {e}"))?;
    if a.metadata().is_ok() {
        return Err("the mount still answers after the power cut".into());
    }
    drop((a, b, c));
    mounted.unmount()?;
    drop(mounted);
    io("finish", shared.finish())?;
    // What a reboot finds.
    let expect: Vec<(&str, Option<&[u8]>)> = match policy {
        CutPolicy::DropAll => vec![
            ("a", Some(&files["a"].durable)),
            ("b", None),
            ("c", None),
            ("d", Some(&cshadow.durable)),
            ("e", Some(&cshadow.durable)),
        ],
        _ => vec![
            ("a", None),
            ("b", Some(&files["b"].live)),
            ("c", None),
            ("d", Some(&cshadow.live)),
            ("e", Some(&cshadow.live)),
        ],
    };
    for (name, want) in expect {
        let got = std::fs::read(backing.join(name)).ok();
        if got.as_deref() != want {
            return Err(format!(
                "after a {policy:?} power cut, `{name}` is {} where {} was expected",
                got.map_or("absent".into(), |g| format!("{} bytes", g.len())),
                want.map_or("nothing".into(), |w| format!("{} bytes", w.len())),
            ));
        }
    }
    // Mounted again over what the cut left, the files read back as they are.
    let shared = Arc::new(io("cutfs", Shared::new(&backing, Box::new(|| {})))?);
    let mut mounted = io("mount", Mounted::mount(&shared, &mnt))?;
    for name in ["a", "b", "c", "d", "e"] {
        let direct = std::fs::read(backing.join(name)).ok();
        let through = std::fs::read(mnt.join(name)).ok();
        if direct != through {
            return Err(format!("`{name}` reads differently through a new mount"));
        }
    }
    mounted.unmount()?;
    drop(mounted);
    io("finish", shared.finish())?;
    let left: Vec<_> = io("read_dir", std::fs::read_dir(&backing))?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    if left.iter().any(|n| n == ".cutfs") {
        return Err("the staging directory is left behind".into());
    }
    Ok(checked)
}

/// Both rounds; the number of reads and lengths compared.
pub fn run(seed: u64) -> Result<u64, String> {
    Ok(round(seed, CutPolicy::DropAll)? + round(seed ^ 1, CutPolicy::KeepAll)?)
}
