//! Starting a test Slurm cluster with one of the project's scripts (`scripts/slurm-cluster`,
//! `scripts/slurm-cluster-ns`), for the test binaries that need one.

use std::path::Path;
use std::process::Command;

/// Starts the cluster of SCRIPT (a path under the repository ROOT) with ENVS, stopped again
/// when this test binary exits unless it was up already (the README's test command leaves
/// nothing running): the cluster's `SLURM_CONF`, or why the tests skip.
/// Panics when CI would skip, and when another cluster answers where this one should:
/// nothing may be submitted to it or cancelled on it.
pub(crate) fn start(root: &Path, script: &str, envs: &[(&str, &str)]) -> Result<String, String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("starting a Slurm cluster needs root".into());
    }
    let out = Command::new(root.join(script))
        .args(["start", "--until-exit", &std::process::id().to_string()])
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0) => {
            let printed = String::from_utf8_lossy(&out.stdout).into_owned();
            let conf = printed
                .lines()
                .find_map(|l| l.strip_prefix("SLURM_CONF="))
                .unwrap_or_else(|| panic!("no SLURM_CONF= in:\n{printed}\n{said}"));
            Ok(conf.to_owned())
        }
        // Missing packages: `.ci/run` installs them wherever it can use apt as root.
        Some(2) => {
            assert!(
                !crate::external::ci::required() || !Path::new("/usr/bin/apt-get").exists(),
                "CI must not skip the Slurm tests: .ci/run installs Slurm as root with apt\n{said}"
            );
            Err(format!(
                "Slurm is not installed (scripts/install-slurm): {said}"
            ))
        }
        Some(3) => panic!(
            "a Slurm controller that {script} did not start answers on its port; the tests refuse to use it:\n{said}"
        ),
        _ => panic!("{script} start failed:\n{said}"),
    }
}
