//! The files of `${credential_file:NAME}`, written again in place while their instance runs
//! (a refreshed or replaced credential), for servers that read the file anew.
//!
//! The instance's directory tree below its own directory is its user's to change: a hostile
//! plugin could put a symbolic link where `home` or `.credentials` was, to make the gateway
//! write elsewhere. So the walk opens each directory relative to the last, refusing links
//! (`O_NOFOLLOW`), from the instance's directory (whose parent is the gateway's), writes the new
//! value to a new file beside the old one, and renames it over the old: a reader sees the old
//! value or the new one, whole, never a part.

use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::Mode;

/// Where an instance's credential files are, and whose they are.
#[derive(Debug, Clone)]
pub struct CredentialFiles {
    /// The instance's own directory (its parent is the gateway's).
    pub(super) instance: PathBuf,
    pub(super) user: Option<(u32, u32)>,
}

impl CredentialFiles {
    /// Replaces the file of credential `name` with one holding `value`, if the instance was
    /// given one; whether it was.
    pub fn rewrite(&self, name: &str, value: &str) -> std::io::Result<bool> {
        let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let top: OwnedFd = openat(
            nix::fcntl::AT_FDCWD,
            self.instance.as_path(),
            dir_flags,
            Mode::empty(),
        )?;
        let home = openat(top.as_fd(), "home", dir_flags, Mode::empty())?;
        let dir = openat(home.as_fd(), ".credentials", dir_flags, Mode::empty())?;
        // Only a file the instance was started with is written again.
        match openat(
            dir.as_fd(),
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) {
            Ok(_) => {}
            Err(nix::errno::Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        let tmp = format!(".{name}.{:016x}", rand::random::<u64>());
        let fd = openat(
            dir.as_fd(),
            tmp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let mut file = std::fs::File::from(fd);
        let written = (|| {
            file.write_all(value.as_bytes())?;
            if let Some((uid, gid)) = self.user {
                std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            }
            renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name)?;
            Ok::<_, std::io::Error>(())
        })();
        if written.is_err() {
            let _ = nix::unistd::unlinkat(
                dir.as_fd(),
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        written.map(|()| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance() -> (tempfile::TempDir, CredentialFiles) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("home/.credentials")).unwrap();
        let files = CredentialFiles {
            instance: dir.path().to_owned(),
            user: None,
        };
        (dir, files)
    }

    #[test]
    fn a_file_the_instance_has_is_replaced_whole() {
        let (dir, files) = instance();
        let path = dir.path().join("home/.credentials/tok");
        std::fs::write(&path, "old").unwrap();
        assert!(files.rewrite("tok", "new-value").unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new-value");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Nothing left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("home/.credentials"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["tok"]);
        // A file it was not started with is not made.
        assert!(!files.rewrite("other", "x").unwrap());
        assert!(!dir.path().join("home/.credentials/other").exists());
    }

    /// A plugin that swaps its `.credentials` (or `home`) for a link does not make the gateway
    /// write where the link points.
    #[test]
    fn regression_a_link_in_the_instance_s_tree_is_not_followed() {
        let (dir, files) = instance();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("tok"), "theirs").unwrap();
        std::fs::remove_dir(dir.path().join("home/.credentials")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("home/.credentials")).unwrap();
        assert!(files.rewrite("tok", "ours").is_err());
        assert_eq!(
            std::fs::read_to_string(elsewhere.path().join("tok")).unwrap(),
            "theirs"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 1);
        // The same with `home` itself a link.
        let (dir, files) = instance();
        std::fs::remove_dir_all(dir.path().join("home")).unwrap();
        std::fs::create_dir(elsewhere.path().join(".credentials")).unwrap();
        std::fs::write(elsewhere.path().join(".credentials/tok"), "theirs").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("home")).unwrap();
        assert!(files.rewrite("tok", "ours").is_err());
        assert_eq!(
            std::fs::read_to_string(elsewhere.path().join(".credentials/tok")).unwrap(),
            "theirs"
        );
        // And the file itself a link: replaced as a name, the target untouched.
        let (dir, files) = instance();
        let target = elsewhere.path().join("target");
        std::fs::write(&target, "theirs").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("home/.credentials/tok")).unwrap();
        let _ = files.rewrite("tok", "ours");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
    }
}
