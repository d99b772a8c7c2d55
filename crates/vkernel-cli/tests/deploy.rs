//! The deployment files in deploy/, checked against the real command:
//! the Kubernetes manifests parse as YAML (python3-yaml, from .ci/deps),
//! hang together and meet Pod Security "restricted", and every `vkernel`
//! subcommand and flag they, the Containerfile and deploy/README.md use
//! exists in this build's CLI. The image itself is built and run with
//! podman by scripts/check-containers.sh, and the manifests are checked
//! against Kubernetes' schemas, both from .ci/run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;
use common::BIN;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every YAML document under deploy/k8s, as JSON.
fn manifests() -> Vec<(String, Value)> {
    const LOAD: &str = "import json, sys, yaml\n\
        for p in sys.argv[1:]:\n\
        \x20   for d in yaml.safe_load_all(open(p)):\n\
        \x20       if d is not None: print(json.dumps([p, d]))\n";
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir().join("k8s"))
        .expect("deploy/k8s")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in deploy/k8s");
    let o = Command::new("python3")
        .arg("-c")
        .arg(LOAD)
        .args(&files)
        .output()
        .expect("python3 (bash .ci/deps)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "manifests do not parse as YAML, or python3-yaml is missing (bash .ci/deps installs it): {err}"
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("json");
            (v[0].as_str().unwrap_or("").to_string(), v[1].clone())
        })
        .collect()
}

fn kind<'a>(docs: &'a [(String, Value)], k: &str) -> &'a Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == k)
        .unwrap_or_else(|| panic!("no {k} in deploy/k8s"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The `vkernel` command lines of a pod spec: each container's args (the
/// image's entrypoint is vkernel) and every exec probe that runs vkernel.
fn command_lines(pod: &Value) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in pod[list].as_array().into_iter().flatten() {
            let args = strings(&c["args"]);
            assert!(
                c["command"].is_null(),
                "a container replaces the entrypoint"
            );
            if !args.is_empty() {
                out.push(args);
            }
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                let cmd = strings(&c[probe]["exec"]["command"]);
                if cmd.first().is_some_and(|p| p == "vkernel") {
                    out.push(cmd[1..].to_vec());
                }
            }
        }
    }
    out
}

/// `vkernel SUB` and its `--flags` (values after `=` dropped).
fn flags_of(line: &[String]) -> (String, BTreeSet<String>) {
    let sub = line.first().cloned().unwrap_or_default();
    let flags = line
        .iter()
        .skip(1)
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect();
    (sub, flags)
}

/// Fails unless `vkernel SUB --help` lists every flag.
fn check_flags(sub: &str, flags: &BTreeSet<String>, whence: &str) {
    let o = Command::new(BIN)
        .args([sub, "--help"])
        .output()
        .expect("vkernel --help");
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{whence}: `vkernel {sub}` is not a command"
    );
    for f in flags {
        let listed = help.lines().any(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("-h, ").unwrap_or(l);
            l.split([' ', ',', '=']).next() == Some(f.as_str())
        });
        assert!(listed, "{whence}: `vkernel {sub}` has no {f}");
    }
}

#[test]
fn manifests_hang_together() {
    let docs = manifests();
    let svc = kind(&docs, "Service");
    let sts = kind(&docs, "StatefulSet");
    let name = svc["metadata"]["name"].as_str().expect("service name");
    assert_eq!(svc["spec"]["clusterIP"], "None", "the Service is headless");
    assert_eq!(sts["spec"]["serviceName"], name);
    let labels = &sts["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&labels[k], v, "the Service selects the StatefulSet's pods");
    }
    let udp: Vec<u64> = svc["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter(|p| p["protocol"] == "UDP")
        .filter_map(|p| p["port"].as_u64())
        .collect();

    let pod = &sts["spec"]["template"]["spec"];
    let lines = command_lines(pod);
    let host = lines
        .iter()
        .find(|l| l.first().is_some_and(|s| s == "host"))
        .expect("a container runs `vkernel host`");
    // The peer is the headless Service's name, in the pod's namespace,
    // on the port the Service and the host use; it parses as --peer does.
    let peer = host
        .iter()
        .find_map(|a| a.strip_prefix("--peer="))
        .expect("--peer=NAME:PORT");
    let peer = peer.replace("$(POD_NAMESPACE)", "default");
    let spec = vkernel::PeerSpec::parse(&peer).expect("the peer parses");
    match spec {
        vkernel::PeerSpec::Name { host: h, port } => {
            assert_eq!(h, format!("{name}.default.svc.cluster.local"));
            assert!(
                udp.contains(&u64::from(port)),
                "peer port {port} not in the Service"
            );
            let bind = format!("--bind=0.0.0.0:{port}");
            assert!(host.contains(&bind), "the host binds {bind}");
        }
        other => panic!("the peer is a name, not {other}"),
    }
    // /dev/shm is a memory-backed emptyDir with a size.
    let shm = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["emptyDir"]["medium"] == "Memory" && v["name"] == "shm")
        .expect("an emptyDir medium Memory named shm");
    assert!(shm["emptyDir"]["sizeLimit"].is_string());
    let mounts_shm = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "shm" && m["mountPath"] == "/dev/shm")
    };
    for list in ["initContainers", "containers"] {
        for c in pod[list].as_array().into_iter().flatten() {
            assert!(mounts_shm(c), "{} mounts /dev/shm", c["name"]);
        }
    }
}

#[test]
fn every_vkernel_flag_in_deploy_exists() {
    let mut lines: Vec<(String, Vec<String>)> = Vec::new();
    for (file, d) in manifests() {
        if d["kind"] == "StatefulSet" {
            for l in command_lines(&d["spec"]["template"]["spec"]) {
                lines.push((file.clone(), l));
            }
        }
    }
    // The Containerfile's default command (a JSON array).
    let cf = std::fs::read_to_string(deploy_dir().join("Containerfile")).expect("Containerfile");
    let cmd = cf
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("a CMD line");
    let cmd: Vec<String> = serde_json::from_str(cmd).expect("CMD is a JSON array");
    lines.push(("deploy/Containerfile".into(), cmd));
    assert!(cf
        .lines()
        .any(|l| l.starts_with("ENTRYPOINT ") && l.contains("vkernel")));
    // Commands shown in deploy/README.md (lines starting `vkernel `,
    // possibly after `kubectl exec ... --`, and the image's arguments in
    // `podman run ... IMAGE SUB ...`).
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).expect("README");
    for l in readme.lines() {
        let l = l.split(" #").next().unwrap_or(l);
        if let Some(args) = l.split("localhost/vkernel:dev ").nth(1) {
            let words: Vec<String> = args.split_whitespace().map(String::from).collect();
            lines.push(("deploy/README.md".into(), words));
            continue;
        }
        let Some(rest) = l
            .split("vkernel ")
            .nth(1)
            .filter(|_| l.trim_start().starts_with("vkernel ") || l.contains("-- vkernel "))
        else {
            continue;
        };
        let words: Vec<String> = rest.split_whitespace().map(String::from).collect();
        lines.push(("deploy/README.md".into(), words));
    }
    assert!(lines.len() >= 4, "too few command lines found: {lines:?}");
    for (file, l) in &lines {
        let (sub, flags) = flags_of(l);
        check_flags(&sub, &flags, &format!("{file}: {}", l.join(" ")));
    }
}

/// The StatefulSet's pods pass Kubernetes' Pod Security "restricted"
/// profile (as of 1.29): what a namespace with
/// `pod-security.kubernetes.io/enforce: restricted` admits.
#[test]
fn pods_meet_pod_security_restricted() {
    let docs = manifests();
    let pod = &kind(&docs, "StatefulSet")["spec"]["template"]["spec"];
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[host] != true, "{host}");
    }
    let pod_sc = &pod["securityContext"];
    const VOLUMES: [&str; 8] = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    for v in pod["volumes"].as_array().into_iter().flatten() {
        let kinds: Vec<&String> = v
            .as_object()
            .expect("volume")
            .keys()
            .filter(|k| *k != "name")
            .collect();
        assert!(
            kinds.iter().all(|k| VOLUMES.contains(&k.as_str())),
            "volume {} is of a kind restricted refuses: {kinds:?}",
            v["name"]
        );
    }
    for list in ["initContainers", "containers"] {
        for c in pod[list].as_array().into_iter().flatten() {
            let name = &c["name"];
            let sc = &c["securityContext"];
            // A container's own setting wins over the pod's.
            let of = |k: &str| {
                if sc[k].is_null() {
                    pod_sc[k].clone()
                } else {
                    sc[k].clone()
                }
            };
            assert_eq!(of("runAsNonRoot"), true, "{name}: runAsNonRoot");
            assert!(of("runAsUser") != 0, "{name}: runAsUser 0");
            let seccomp = of("seccompProfile");
            assert!(
                matches!(
                    seccomp["type"].as_str(),
                    Some("RuntimeDefault" | "Localhost")
                ),
                "{name}: seccompProfile.type must be RuntimeDefault or Localhost, is {seccomp}"
            );
            assert_eq!(
                sc["allowPrivilegeEscalation"], false,
                "{name}: allowPrivilegeEscalation"
            );
            assert!(sc["privileged"] != true, "{name}: privileged");
            let drop = strings(&sc["capabilities"]["drop"]);
            assert!(drop.iter().any(|d| d == "ALL"), "{name}: drops ALL");
            let add = strings(&sc["capabilities"]["add"]);
            assert!(
                add.iter().all(|a| a == "NET_BIND_SERVICE"),
                "{name}: adds {add:?}"
            );
            for p in c["ports"].as_array().into_iter().flatten() {
                assert!(p["hostPort"].is_null(), "{name}: hostPort");
            }
        }
    }
}
