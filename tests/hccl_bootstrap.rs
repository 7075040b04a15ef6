//! Table tests for `Bootstrap::from_lookup`: every launcher, and every bad environment naming
//! the variable and the value.

use std::net::SocketAddr;

use dropcompute::hccl::bootstrap::{Bootstrap, ConfigError, Explicit, Launcher, Rendezvous};
use dropcompute::hccl::rendezvous::JobSecret;

type Vars<'a> = &'a [(&'a str, &'a str)];
/// (env, variable named, text the error must contain)
type BadRow<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn run(explicit: Explicit, vars: Vars) -> Result<Bootstrap, ConfigError> {
    Bootstrap::from_lookup(explicit, |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn tcp(addr: &str) -> Rendezvous {
    Rendezvous::Tcp { addr: sa(addr), secret: JobSecret::from_hex(SECRET).unwrap() }
}

#[test]
fn good_environments() {
    let torchrun: Vars = &[
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("DROPCOMPUTE_JOB_SECRET", SECRET),
    ];
    let mpi: Vars = &[
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("DROPCOMPUTE_RENDEZVOUS", "10.1.2.3:4000"),
        ("DROPCOMPUTE_JOB_SECRET", SECRET),
        ("HABANA_VISIBLE_MODULES", "4,5,6,7"),
    ];
    let slurm: Vars = &[
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "3"),
        ("SLURM_LOCALID", "0"),
        ("DROPCOMPUTE_RENDEZVOUS", "[::1]:4000"),
        ("DROPCOMPUTE_JOB_SECRET", SECRET),
    ];
    let same_values: Vars = &[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("HCCL_COMM_ID", "10.0.0.1:9999"),
    ];
    // srun torchrun: the outer Slurm variables disagree; DROPCOMPUTE_LAUNCHER picks torchrun.
    let nested: Vars = &[
        ("DROPCOMPUTE_LAUNCHER", "torchrun"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("RANK", "9"),
        ("WORLD_SIZE", "16"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("DROPCOMPUTE_RENDEZVOUS", "127.0.0.2:7000"),
        ("DROPCOMPUTE_JOB_SECRET", SECRET),
    ];
    let single_torchrun: Vars = &[("RANK", "0"), ("WORLD_SIZE", "1")];
    let explicit_all = Explicit {
        rank: Some(1),
        world_size: Some(2),
        local_rank: Some(0),
        addr: Some(sa("127.0.0.1:5000")),
        secret: Some(JobSecret::from_hex(SECRET).unwrap()),
    };
    let explicit_rank = Explicit { rank: Some(2), ..Explicit::default() };
    // (explicit, env, rank, world size, local rank, local world size, launcher, rendezvous)
    type Row<'a> = (Explicit, Vars<'a>, u32, u32, u32, Option<u32>, Launcher, Rendezvous);
    let rows: Vec<Row> = vec![
        (Explicit::default(), &[], 0, 1, 0, None, Launcher::Single, Rendezvous::None),
        (Explicit::default(), torchrun, 3, 4, 1, Some(2), Launcher::Torchrun, tcp("127.0.0.1:29500")),
        (Explicit::default(), mpi, 5, 8, 1, Some(4), Launcher::OpenMpi, tcp("10.1.2.3:4000")),
        (Explicit::default(), slurm, 2, 3, 0, None, Launcher::Slurm, tcp("[::1]:4000")),
        (
            Explicit::default(),
            same_values,
            1,
            2,
            1,
            None,
            Launcher::Torchrun,
            Rendezvous::HcclCommId(sa("10.0.0.1:9999")),
        ),
        (Explicit::default(), nested, 9, 16, 1, None, Launcher::Torchrun, tcp("127.0.0.2:7000")),
        (Explicit::default(), single_torchrun, 0, 1, 0, None, Launcher::Torchrun, Rendezvous::None),
        (explicit_all.clone(), &[], 1, 2, 0, None, Launcher::Explicit, tcp("127.0.0.1:5000")),
        // Explicit values win over the environment; the environment fills the rest.
        (explicit_all, torchrun, 1, 2, 0, None, Launcher::Explicit, tcp("127.0.0.1:5000")),
        (explicit_rank, torchrun, 2, 4, 1, None, Launcher::Explicit, tcp("127.0.0.1:29500")),
    ];
    for (explicit, vars, rank, world_size, local_rank, local_world_size, launcher, rendezvous) in rows {
        let want = Bootstrap { rank, world_size, local_rank, local_world_size, launcher, rendezvous, warnings: vec![] };
        assert_eq!(run(explicit, vars).unwrap(), want, "{vars:?}");
    }
}

#[test]
fn host_names_resolve() {
    let vars: Vars = &[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "localhost"),
        ("MASTER_PORT", "29500"),
        ("DROPCOMPUTE_JOB_SECRET", SECRET),
    ];
    match run(Explicit::default(), vars).unwrap().rendezvous {
        Rendezvous::Tcp { addr, .. } => assert!(addr.ip().is_loopback() && addr.port() == 29500, "{addr}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_environments_name_variable_and_value() {
    let two: &[(&str, &str)] = &[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")];
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<(&str, &str)> = two.to_vec();
        v.extend_from_slice(extra);
        v
    };
    let master = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")];
    let secret = ("DROPCOMPUTE_JOB_SECRET", SECRET);
    let mpi2 =
        [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0"), secret];
    let slurm2 = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0"), secret];
    // (env, variable named, text the error must contain: the value or the hint)
    let rows: Vec<BadRow> = vec![
        (vec![("RANK", "x"), ("WORLD_SIZE", "2")], "RANK", "\"x\""),
        (vec![("RANK", "0"), ("WORLD_SIZE", "-1")], "WORLD_SIZE", "\"-1\""),
        (vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "one")], "LOCAL_RANK", "\"one\""),
        (vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2.5")], "SLURM_NTASKS", "\"2.5\""),
        (vec![("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "0")], "OMPI_COMM_WORLD_SIZE", "\"0\""),
        (vec![("RANK", "4"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0")], "RANK", "\"4\""),
        (with(&[("LOCAL_WORLD_SIZE", "1")]), "LOCAL_RANK", "\"1\""),
        (with(&[("LOCAL_WORLD_SIZE", "0")]), "LOCAL_WORLD_SIZE", "\"0\""),
        (with(&[("LOCAL_WORLD_SIZE", "3")]), "LOCAL_WORLD_SIZE", "\"3\""),
        (vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "2")], "LOCAL_RANK", "\"2\""),
        (vec![("RANK", "1")], "WORLD_SIZE", "RANK=1"),
        (vec![("OMPI_COMM_WORLD_SIZE", "4")], "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE=4"),
        (vec![("RANK", "1"), ("WORLD_SIZE", "2")], "LOCAL_RANK", "RANK=1"),
        (with(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]), "RANK", "OMPI_COMM_WORLD_RANK=0"),
        (with(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "3")]), "WORLD_SIZE", "SLURM_NTASKS=3"),
        (
            with(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0")]),
            "LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK=0",
        ),
        (with(&[("DROPCOMPUTE_LAUNCHER", "pbs")]), "DROPCOMPUTE_LAUNCHER", "\"pbs\""),
        (with(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "abc"), secret]), "MASTER_PORT", "\"abc\""),
        (with(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "0"), secret]), "MASTER_PORT", "\"0\""),
        (with(&[("MASTER_ADDR", "127.0.0.1"), secret]), "MASTER_PORT", "MASTER_ADDR=127.0.0.1"),
        (with(&[("MASTER_ADDR", "0.0.0.0"), ("MASTER_PORT", "29500"), secret]), "MASTER_ADDR", "\"0.0.0.0\""),
        (with(&[("DROPCOMPUTE_RENDEZVOUS", "node01"), secret]), "DROPCOMPUTE_RENDEZVOUS", "\"node01\""),
        (with(&[("DROPCOMPUTE_RENDEZVOUS", "::1:4000"), secret]), "DROPCOMPUTE_RENDEZVOUS", "[::1]:4000"),
        (with(&[("DROPCOMPUTE_RENDEZVOUS", ":4000"), secret]), "DROPCOMPUTE_RENDEZVOUS", "no host"),
        (with(&[("DROPCOMPUTE_RENDEZVOUS", "10.0.0.1:70000"), secret]), "DROPCOMPUTE_RENDEZVOUS", "\"10.0.0.1:70000\""),
        (with(&[("DROPCOMPUTE_RENDEZVOUS", "0.0.0.0:4000"), secret]), "DROPCOMPUTE_RENDEZVOUS", "\"0.0.0.0:4000\""),
        (with(&[("DROPCOMPUTE_RENDEZVOUS", "[::]:4000"), secret]), "DROPCOMPUTE_RENDEZVOUS", "unspecified"),
        (with(&[("HCCL_COMM_ID", "node01:9999")]), "HCCL_COMM_ID", "\"node01:9999\""),
        (with(&[("HCCL_COMM_ID", "10.0.0.1")]), "HCCL_COMM_ID", "\"10.0.0.1\""),
        (with(&[("HCCL_COMM_ID", "10.0.0.1:0")]), "HCCL_COMM_ID", "port 0"),
        (with(&master), "DROPCOMPUTE_JOB_SECRET", "openssl rand -hex 16"),
        (
            with(&[master[0], master[1], ("DROPCOMPUTE_JOB_SECRET", "not-hex-at-all-not-hex-at-all-xx")]),
            "DROPCOMPUTE_JOB_SECRET",
            "<32 characters, not shown>",
        ),
        (with(&[master[0], master[1], ("DROPCOMPUTE_JOB_SECRET", "abcd")]), "DROPCOMPUTE_JOB_SECRET", "16 bits"),
        // A set but unused variable is still checked: a single rank with a bad secret.
        (vec![("DROPCOMPUTE_JOB_SECRET", "abcd")], "DROPCOMPUTE_JOB_SECRET", "<4 characters, not shown>"),
        (mpi2.to_vec(), "DROPCOMPUTE_RENDEZVOUS", "mpirun -x DROPCOMPUTE_RENDEZVOUS"),
        (slurm2.to_vec(), "DROPCOMPUTE_RENDEZVOUS", "SLURM_JOB_NODELIST"),
        (with(&[("HABANA_VISIBLE_MODULES", "3")]), "HABANA_VISIBLE_MODULES", "\"3\""),
        (with(&[("HABANA_VISIBLE_MODULES", "a,b")]), "HABANA_VISIBLE_MODULES", "\"a,b\""),
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "4"),
                ("HABANA_VISIBLE_MODULES", "0,1"),
            ],
            "HABANA_VISIBLE_MODULES",
            "\"0,1\"",
        ),
        (vec![("HLS_MODULE_ID", "x")], "HLS_MODULE_ID", "\"x\""),
    ];
    for (vars, variable, text) in &rows {
        let err = run(Explicit::default(), vars).expect_err(&format!("{vars:?} should fail"));
        assert_eq!(err.variable(), *variable, "{vars:?}: {err}");
        assert!(err.to_string().contains(text), "{vars:?}: {err} lacks {text}");
        // A job secret is never echoed, even a malformed one.
        if let Some((_, secret)) = vars.iter().find(|(k, _)| *k == "DROPCOMPUTE_JOB_SECRET") {
            assert!(!err.to_string().contains(secret), "{err} echoes the secret");
        }
    }
}

#[test]
fn bad_explicit_values() {
    let rows: Vec<(Explicit, &str, &str)> = vec![
        (Explicit { rank: Some(1), ..Explicit::default() }, "explicit world_size", "rank=1"),
        (Explicit { world_size: Some(2), ..Explicit::default() }, "explicit rank", "world_size=2"),
        (Explicit { rank: Some(2), world_size: Some(2), ..Explicit::default() }, "explicit rank", "\"2\""),
        (Explicit { rank: Some(0), world_size: Some(0), ..Explicit::default() }, "explicit world_size", "\"0\""),
        (Explicit { rank: Some(1), world_size: Some(2), ..Explicit::default() }, "explicit local_rank", "rank=1"),
        (
            Explicit { rank: Some(1), world_size: Some(2), local_rank: Some(0), ..Explicit::default() },
            "DROPCOMPUTE_RENDEZVOUS",
            "2 ranks",
        ),
        (Explicit { addr: Some(sa("0.0.0.0:5000")), ..Explicit::default() }, "explicit addr", "\"0.0.0.0:5000\""),
    ];
    for (explicit, variable, text) in rows {
        let err = run(explicit.clone(), &[]).expect_err(&format!("{explicit:?} should fail"));
        assert_eq!(err.variable(), variable, "{explicit:?}: {err}");
        assert!(err.to_string().contains(text), "{explicit:?}: {err} lacks {text}");
    }
}

/// `HCCL_COMM_ID` as the vendor library parses it (split at the last ':', the left part a bare
/// address): bare IPv6 accepted, host names resolved, the bracketed form refused with the
/// accepted spelling; and a warning naming both variables and values whenever it overrides
/// `DROPCOMPUTE_RENDEZVOUS` or `MASTER_ADDR`/`MASTER_PORT` (it used to win silently).
#[test]
fn hccl_comm_id_follows_the_vendor_parser_and_warns_when_it_overrides() {
    let two = [("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")];
    let with = |extra: &[(&'static str, &'static str)]| [&two[..], extra].concat();
    let ok = |vars: &[(&str, &str)]| run(Explicit::default(), vars).unwrap();
    let b = ok(&with(&[("HCCL_COMM_ID", "::1:29576")]));
    assert_eq!(b.rendezvous, Rendezvous::HcclCommId(sa("[::1]:29576")));
    assert!(b.warnings.is_empty(), "{:?}", b.warnings);
    let b = ok(&with(&[("HCCL_COMM_ID", "localhost:29577")]));
    assert_eq!(b.rendezvous, Rendezvous::HcclCommId(sa("127.0.0.1:29577")), "a host name is resolved");
    match run(Explicit::default(), &with(&[("HCCL_COMM_ID", "[::1]:29575")])) {
        Err(ConfigError::Invalid { variable, value, reason }) => {
            assert_eq!((variable.as_str(), value.as_str()), ("HCCL_COMM_ID", "[::1]:29575"));
            assert!(reason.contains("HCCL_COMM_ID=::1:29575"), "gives the accepted form: {reason}");
        }
        other => panic!("the bracketed form must be refused: {other:?}"),
    }

    let b = ok(&with(&[
        ("HCCL_COMM_ID", "::1:29576"),
        ("DROPCOMPUTE_RENDEZVOUS", "127.0.0.1:4000"),
        ("DROPCOMPUTE_JOB_SECRET", SECRET),
    ]));
    assert_eq!(b.rendezvous, Rendezvous::HcclCommId(sa("[::1]:29576")), "HCCL_COMM_ID wins");
    assert_eq!(b.warnings.len(), 1, "{:?}", b.warnings);
    assert!(
        b.warnings[0].contains("HCCL_COMM_ID=::1:29576")
            && b.warnings[0].contains("DROPCOMPUTE_RENDEZVOUS=127.0.0.1:4000")
    );
    let b = ok(&with(&[("HCCL_COMM_ID", "10.0.0.1:9999"), ("MASTER_ADDR", "10.0.0.2"), ("MASTER_PORT", "29500")]));
    assert_eq!(b.warnings.len(), 2, "{:?}", b.warnings);
    assert!(b.warnings[0].contains("HCCL_COMM_ID=10.0.0.1:9999") && b.warnings[0].contains("MASTER_ADDR=10.0.0.2"));
    assert!(b.warnings[1].contains("HCCL_COMM_ID=10.0.0.1:9999") && b.warnings[1].contains("MASTER_PORT=29500"));
}

/// The one address grammar (`habana_sys::addr`) through each of the three address variables:
/// every form (host, IPv4, [IPv6], bare IPv6, with and without a port, a bad port, an empty
/// host), the address it gives or a word of the refusal (issue 24, found 6: `MASTER_ADDR=[::1]`
/// said "host does not resolve").
#[test]
fn every_address_form_in_each_address_variable() {
    let two = [("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("DROPCOMPUTE_JOB_SECRET", SECRET)];
    // (variables added to `two`, Ok(rank 0's address) or Err((variable named, word of the reason)))
    type AddrRow = (Vec<(&'static str, &'static str)>, Result<&'static str, (&'static str, &'static str)>);
    let m = |addr: &'static str| vec![("MASTER_ADDR", addr), ("MASTER_PORT", "29500")];
    let r = |v: &'static str| vec![("DROPCOMPUTE_RENDEZVOUS", v)];
    let h = |v: &'static str| vec![("HCCL_COMM_ID", v)];
    let rows: Vec<AddrRow> = vec![
        (m("localhost"), Ok("127.0.0.1:29500")),
        (m("127.0.0.1"), Ok("127.0.0.1:29500")),
        (m("::1"), Ok("[::1]:29500")),
        (m("[::1]"), Ok("[::1]:29500")),
        (m("127.0.0.1:29501"), Err(("MASTER_ADDR", "MASTER_PORT"))),
        (m("[::1]:29501"), Err(("MASTER_ADDR", "MASTER_PORT"))),
        (m("::1:29501"), Err(("MASTER_ADDR", "[::1]:29501"))),
        (m("[::1"), Err(("MASTER_ADDR", "']'"))),
        (vec![("MASTER_ADDR", "::1"), ("MASTER_PORT", "http")], Err(("MASTER_PORT", "1..=65535"))),
        (r("localhost:4000"), Ok("127.0.0.1:4000")),
        (r("127.0.0.1:4000"), Ok("127.0.0.1:4000")),
        (r("[::1]:4000"), Ok("[::1]:4000")),
        (r("::1:4000"), Err(("DROPCOMPUTE_RENDEZVOUS", "[::1]:4000"))),
        (r("::1"), Err(("DROPCOMPUTE_RENDEZVOUS", "[::1]:PORT"))),
        (r("[::1]"), Err(("DROPCOMPUTE_RENDEZVOUS", "[IPv6]:PORT"))),
        (r("127.0.0.1"), Err(("DROPCOMPUTE_RENDEZVOUS", "HOST:PORT"))),
        (r("127.0.0.1:0"), Err(("DROPCOMPUTE_RENDEZVOUS", "port 0"))),
        (r("[::1]:x"), Err(("DROPCOMPUTE_RENDEZVOUS", "1..=65535"))),
        (r(":4000"), Err(("DROPCOMPUTE_RENDEZVOUS", "no host"))),
        (h("localhost:9999"), Ok("127.0.0.1:9999")),
        (h("127.0.0.1:9999"), Ok("127.0.0.1:9999")),
        (h("::1:9999"), Ok("[::1]:9999")),
        (h("[::1]:9999"), Err(("HCCL_COMM_ID", "HCCL_COMM_ID=::1:9999"))),
        (h("127.0.0.1"), Err(("HCCL_COMM_ID", "last ':'"))),
        (h("127.0.0.1:65536"), Err(("HCCL_COMM_ID", "1..=65535"))),
        (h(":9999"), Err(("HCCL_COMM_ID", "no host"))),
    ];
    for (extra, want) in rows {
        let vars: Vec<(&str, &str)> = two.iter().copied().chain(extra.iter().copied()).collect();
        let got = run(Explicit::default(), &vars);
        match (got, want) {
            (Ok(b), Ok(addr)) => {
                let at = match b.rendezvous {
                    Rendezvous::Tcp { addr, .. } | Rendezvous::HcclCommId(addr) => addr,
                    Rendezvous::None | Rendezvous::Local { .. } => panic!("{extra:?}: no TCP rendezvous"),
                };
                assert_eq!(at, sa(addr), "{extra:?}");
            }
            (Err(e), Err((var, why))) => {
                assert_eq!(e.variable(), var, "{extra:?}: {e}");
                assert!(e.to_string().contains(why), "{extra:?}: {e} lacks {why:?}");
            }
            (got, want) => panic!("{extra:?}: got {got:?}, want {want:?}"),
        }
    }
}

/// The one-host rendezvous (`hccl::local`): chosen only when every rank is local, the launcher
/// gives a job id and no address is set; an address given wins; torchrun's MASTER_PORT (its
/// agent's store) is never bound; a multi-host job without an address is refused naming
/// `DROPCOMPUTE_RENDEZVOUS`, never given a guessed address.
#[test]
fn one_host_jobs_meet_through_a_private_file_and_multi_host_jobs_need_an_address() {
    let uid_dir = |tmp: &str| format!("{tmp}/dropcompute-rendezvous-");
    let mpi = |local: &'static str| -> Vec<(&'static str, &'static str)> {
        vec![
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", local),
            ("PMIX_NAMESPACE", "prterun-host-77@1"),
            ("TMPDIR", "/t"),
        ]
    };
    let slurm = |nodes: &'static str| -> Vec<(&'static str, &'static str)> {
        vec![
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NNODES", nodes),
            ("SLURM_JOB_ID", "812"),
            ("SLURM_STEP_ID", "3"),
            ("TMPDIR", "/t"),
        ]
    };
    let torchrun = |local: &'static str| -> Vec<(&'static str, &'static str)> {
        vec![
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", local),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29511"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TMPDIR", "/t"),
        ]
    };
    // (environment, the private file's name, or None: refused naming DROPCOMPUTE_RENDEZVOUS)
    type Row = (Vec<(&'static str, &'static str)>, Option<&'static str>);
    let rows: Vec<Row> = vec![
        (mpi("4"), Some("openmpi-prterun-host-77_1.rendezvous")),
        (mpi("2"), None),
        (slurm("1"), Some("slurm-812.3.rendezvous")),
        (slurm("2"), None),
        (torchrun("2"), Some("torchrun-abc-29511.rendezvous")),
        (torchrun("1"), None),
    ];
    for (vars, want) in rows {
        match (run(Explicit::default(), &vars), want) {
            (Ok(b), Some(name)) => match &b.rendezvous {
                Rendezvous::Local { file } => {
                    let f = file.display().to_string();
                    assert!(f.starts_with(&uid_dir("/t")) && f.ends_with(&format!("/{name}")), "{vars:?}: {f}");
                }
                other => panic!("{vars:?}: {other:?}"),
            },
            (Err(e), None) => {
                assert_eq!(e.variable(), "DROPCOMPUTE_RENDEZVOUS", "{vars:?}: {e}");
                assert!(matches!(e, ConfigError::Missing { .. }), "{vars:?}: {e}");
            }
            (got, want) => panic!("{vars:?}: got {got:?}, want {want:?}"),
        }
        // An address given wins over the private file (with the secret it needs).
        let mut given = vars.clone();
        given.extend([("DROPCOMPUTE_RENDEZVOUS", "127.0.0.1:4100"), ("DROPCOMPUTE_JOB_SECRET", SECRET)]);
        let b = run(Explicit::default(), &given).unwrap();
        assert_eq!(b.rendezvous, tcp("127.0.0.1:4100"), "{given:?}");
    }
    // torchrun without its agent store (an older torchrun, or variables set by hand): its
    // MASTER_ADDR:MASTER_PORT is ours, as before.
    let mut own: Vec<(&str, &str)> =
        torchrun("2").into_iter().filter(|(k, _)| *k != "TORCHELASTIC_USE_AGENT_STORE").collect();
    own.extend([("MASTER_ADDR", "127.0.0.1"), ("DROPCOMPUTE_JOB_SECRET", SECRET)]);
    own.retain(|(k, v)| *k != "MASTER_ADDR" || *v == "127.0.0.1");
    assert_eq!(run(Explicit::default(), &own).unwrap().rendezvous, tcp("127.0.0.1:29511"));
}
