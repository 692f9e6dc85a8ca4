//! Read-only deployments: a database in a directory the serving process cannot write (a
//! root-owned `/opt/models`, a read-only container image) serves every read command, and
//! read commands leave no `-wal`/`-shm` files behind. Run as an unprivileged user: as root
//! (CI) the commands drop to `nobody` with `setpriv`; as anyone else they run as themselves.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{autokernel, ok_json_lines, stderr};

const W: &str = "gemm:24x20x16";

/// `autokernel ARGS` as a user who cannot write the deployment directory, running `bin` (a
/// copy of the binary in a directory that user can enter: the checkout may not be).
fn unprivileged(bin: &Path, args: &[&str]) -> Output {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args)
        .output()
        .expect("setpriv (util-linux) runs the binary")
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn every_read_command_works_on_a_read_only_deployment() {
    let root = tempfile::tempdir().unwrap();
    chmod(root.path(), 0o755);
    let bin = root.path().join("autokernel");
    std::fs::copy(env!("CARGO_BIN_EXE_autokernel"), &bin).unwrap();
    chmod(&bin, 0o755);
    let unprivileged = |args: &[&str]| unprivileged(&bin, args);
    let deploy = root.path().join("models");
    std::fs::create_dir(&deploy).unwrap();
    let db = deploy.join("tuning.db");
    let dbs = db.to_str().unwrap();
    let o = autokernel(&[
        "tune",
        "--workload",
        W,
        "--db",
        dbs,
        "--budget",
        "2",
        "--json",
    ]);
    ok_json_lines(&o);
    assert_eq!(
        listing(&deploy),
        ["tuning.db"],
        "a finished writer leaves one file"
    );

    // Read commands in a writable directory leave nothing behind.
    ok_json_lines(&autokernel(&[
        "lookup",
        "--workload",
        W,
        "--db",
        dbs,
        "--json",
    ]));
    ok_json_lines(&autokernel(&["db", "stats", "--db", dbs, "--json"]));
    assert_eq!(listing(&deploy), ["tuning.db"], "no -wal/-shm from readers");

    // The deployment: the directory and the file read-only, the reader another user.
    chmod(&db, 0o444);
    chmod(&deploy, 0o555);
    let out = root.path().join("out");
    std::fs::create_dir(&out).unwrap();
    chmod(&out, 0o777);
    let bundle = out.join("b.bundle");
    let bundle = bundle.to_str().unwrap();
    let reads: Vec<Vec<&str>> = vec![
        vec!["lookup", "--workload", W, "--db", dbs, "--json"],
        vec!["run", "--workload", W, "--db", dbs, "--json"],
        vec!["bench", "--db", dbs, "--quick", "--rounds", "1", "--json"],
        vec!["db", "stats", "--db", dbs, "--json"],
        vec!["db", "verify", "--db", dbs, "--json"],
        vec!["db", "diff", dbs, dbs, "--json"],
        vec!["db", "export", "--db", dbs, "--out", bundle, "--json"],
    ];
    for args in &reads {
        let o = unprivileged(args);
        assert!(
            o.status.success(),
            "{args:?} as an unprivileged user: {}",
            stderr(&o)
        );
    }
    let o = unprivileged(&["lookup", "--workload", W, "--db", dbs, "--json"]);
    assert_eq!(
        ok_json_lines(&o)[0]["level"],
        "exact",
        "served from the file"
    );
    assert_eq!(listing(&deploy), ["tuning.db"]);
    // A writer there is refused with a clear error, and changes nothing.
    let before = std::fs::read(&db).unwrap();
    let o = unprivileged(&[
        "tune",
        "--workload",
        "gemm:8x8x8",
        "--db",
        dbs,
        "--budget",
        "1",
    ]);
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
    assert_eq!(std::fs::read(&db).unwrap(), before);
    // An export or a merge into the read-only directory: refused naming the output and its
    // directory (the error had named a temporary file and given the tuning database's hint).
    let into = deploy.join("new.db");
    let into = into.to_str().unwrap();
    let writes: [&[&str]; 2] = [
        &["db", "export", "--db", dbs, "--out", into],
        &["db", "merge", dbs, dbs, "--out", into],
    ];
    for args in writes {
        let o = unprivileged(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let want = format!(
            "cannot create {into}: directory {} takes no new files",
            deploy.display()
        );
        assert!(stderr(&o).contains(&want), "{args:?}: {}", stderr(&o));
        assert_eq!(listing(&deploy), ["tuning.db"], "{args:?} left nothing");
    }
    // A read-only file in a directory the writer may write: refused before the first write
    // (it had failed mid-run and left -wal/-shm files the owner could not remove), and the
    // dry run says so too.
    chmod(&deploy, 0o777);
    for extra in [&["--budget", "1"][..], &["--dry-run"][..]] {
        let mut args = vec!["tune", "--workload", "gemm:8x8x8", "--db", dbs];
        args.extend_from_slice(extra);
        let o = unprivileged(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("cannot write it"), "{}", stderr(&o));
        assert_eq!(
            listing(&deploy),
            ["tuning.db"],
            "{args:?} left nothing behind"
        );
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
    chmod(&deploy, 0o755);
}
