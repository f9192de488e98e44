//! A shm directory of a test's own: each test gives its gateway and
//! workers one (a directory in /dev/shm, or a small tmpfs where mounting is
//! allowed), so tests running in parallel never see each other's files.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// A shm directory of the test's own, removed (or unmounted) on drop.
pub struct ShmDir {
    pub path: PathBuf,
    mounted: bool,
    /// The name stem (`smg-<boot>-<instance>`) of each gateway pid seen,
    /// remembered so its names can be listed after its owner file is gone.
    stems: Mutex<HashMap<u32, String>>,
}

impl ShmDir {
    /// A fresh directory inside /dev/shm (same tmpfs, same namespace).
    pub fn in_dev_shm() -> Self {
        let path = PathBuf::from(format!(
            "/dev/shm/smg-lanes-test-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir(&path).expect("shm directory");
        Self {
            path,
            mounted: false,
            stems: Mutex::default(),
        }
    }

    /// A tmpfs of `bytes` of its own, when this process may mount one.
    pub fn small_tmpfs(bytes: u64) -> Option<Self> {
        let path = std::env::temp_dir().join(format!(
            "smg-lanes-tmpfs-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir(&path).ok()?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !mounted {
            let _ = std::fs::remove_dir(&path);
            return None;
        }
        Some(Self {
            path,
            mounted: true,
            stems: Mutex::default(),
        })
    }

    pub fn arg(&self) -> String {
        self.path.display().to_string()
    }

    /// Names in the directory created by the gateway with process id `pid`,
    /// its owner file included. Names carry no pid: the gateway's owner file
    /// (`smg-<boot>-<instance>.owner`) says `pid <pid>`, which gives its
    /// stem; once seen, the stem is remembered, so names left after the
    /// owner file went are still listed.
    pub fn names_of(&self, pid: u32) -> Vec<String> {
        let all: Vec<String> = std::fs::read_dir(&self.path)
            .expect("shm directory")
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect();
        let mut stems = self.stems.lock().expect("stems");
        let stem = match stems.entry(pid) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(unknown) => {
                let says = format!("pid {pid} ");
                let owner = all.iter().find(|name| {
                    name.ends_with(".owner")
                        && std::fs::read_to_string(self.path.join(name))
                            .is_ok_and(|text| text.starts_with(&says))
                });
                match owner {
                    Some(owner) => unknown.insert(owner.trim_end_matches(".owner").to_owned()),
                    None => return Vec::new(),
                }
            }
        };
        let (data, owner) = (format!("{stem}-"), format!("{stem}.owner"));
        let mut names: Vec<String> = all
            .into_iter()
            .filter(|name| name.starts_with(&data) || *name == owner)
            .collect();
        names.sort();
        names
    }

    /// Every file in the directory.
    pub fn all_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.path)
            .expect("shm directory")
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg(&self.path)
                .status();
            let _ = std::fs::remove_dir(&self.path);
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
