//! Redis Cluster: three primaries with a replica each, the module on every
//! node. Traffic spreads over the shards, MCONSUME needs one slot, and a
//! manual failover, or an automatic one after a primary is killed, keeps
//! every bucket.

use std::collections::BTreeMap;
use std::time::Duration;
use testkit::{
    cluster::Cluster, dbsize, error_of, eventually, info_field, server_time_us, snapshot,
    wait_replicas, Config,
};

#[test]
fn cluster_spreads_buckets_routes_mconsume_and_survives_failover() {
    let cluster = Cluster::start(3, 1, Config::default());
    let mut cc = cluster.client();

    // Thousands of calls over all shards through a cluster-aware client.
    let mut admitted = 0;
    for i in 0..3000 {
        let key = format!("rl:user:{}", i % 600);
        let r: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg(&[key.as_str(), "20", "0.01", "1"])
            .query(&mut cc)
            .expect("TB.CONSUME through the cluster");
        admitted += r[0];
    }
    assert_eq!(admitted, 3000, "600 buckets of 20 admit 5 calls each");
    let primaries = cluster.primaries();
    assert_eq!(primaries.len(), 3);
    let sizes: Vec<i64> = primaries.iter().map(|p| dbsize(&mut p.conn())).collect();
    assert_eq!(sizes.iter().sum::<i64>(), 600);
    assert!(
        sizes.iter().all(|&n| n > 100),
        "every shard holds buckets: {sizes:?}"
    );

    // MCONSUME: one hash tag works; keys in different slots get CROSSSLOT.
    let r: redis::Value = redis::cmd("TB.MCONSUME")
        // Slow refill: these buckets must outlive the failovers below.
        .arg(&[
            "rl:{u42}:user",
            "10",
            "0.01",
            "1",
            "rl:{u42}:key",
            "5",
            "0.01",
            "1",
        ])
        .query(&mut cc)
        .expect("same-slot MCONSUME");
    let redis::Value::Array(items) = r else {
        panic!("{r:?}")
    };
    assert_eq!(items[0], redis::Value::Int(1));
    for node in &cluster.nodes {
        let err = error_of(
            &mut node.conn(),
            redis::cmd("TB.MCONSUME").arg(&[
                "rl:user:1",
                "10",
                "1",
                "1",
                "rl:user:2",
                "10",
                "1",
                "1",
            ]),
        );
        assert!(err.starts_with("CROSSSLOT"), "{err}");
    }

    // TB.CHARGE (a bucket beside a quota) and quotas route by their keys:
    // its counted keys are declared exactly, so a hash tag works and keys
    // in different slots get CROSSSLOT, as for MCONSUME.
    let r: redis::Value = redis::cmd("TB.CHARGE")
        .arg(&[
            "2",
            "rl:{u42}:min",
            "rl:{u42}:month",
            "BUCKET",
            "10",
            "0.01",
            "1",
        ])
        .arg(&["QUOTA", "1000", "1000000000", "7"])
        .query(&mut cc)
        .expect("same-slot TB.CHARGE");
    let redis::Value::Array(items) = r else {
        panic!("{r:?}")
    };
    assert_eq!(items[0], redis::Value::Int(1));
    for i in 0..50 {
        let q: Vec<i64> = redis::cmd("TB.QUOTA")
            .arg(&[format!("q:user:{i}").as_str(), "10", "1000000000", "3"])
            .query(&mut cc)
            .expect("TB.QUOTA through the cluster");
        assert_eq!(q, [1, 7, 0, q[3]]);
    }
    for node in &cluster.nodes {
        let err = error_of(
            &mut node.conn(),
            redis::cmd("TB.CHARGE").arg(&[
                "2",
                "rl:user:1",
                "rl:user:2",
                "BUCKET",
                "10",
                "1",
                "1",
                "QUOTA",
                "5",
                "DAY",
                "1",
            ]),
        );
        assert!(err.starts_with("CROSSSLOT"), "{err}");
    }

    // Manual failover of every shard: no bucket or quota lost, none reset.
    let before: BTreeMap<_, _> = primaries
        .iter()
        .flat_map(|p| snapshot(&mut p.conn()))
        .collect();
    let promoted: Vec<u16> = cluster.replicas().iter().map(|r| r.port).collect();
    for replica in cluster.replicas() {
        let mut primary = cluster.primary_of(replica).conn();
        wait_replicas(&mut primary, 1);
        cluster.failover(replica);
    }
    cluster.wait_healthy(3);
    let mut now_primary: Vec<u16> = cluster.primaries().iter().map(|p| p.port).collect();
    now_primary.sort();
    let mut expected = promoted.clone();
    expected.sort();
    assert_eq!(now_primary, expected, "every replica was promoted");
    let after: BTreeMap<_, _> = cluster
        .primaries()
        .iter()
        .flat_map(|p| snapshot(&mut p.conn()))
        .collect();
    assert_eq!(after.len(), before.len());
    assert_eq!(after, before, "tokens, ts and expire times kept");

    // And the new primaries carry on from that state.
    let mut cc = cluster.client();
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(&["rl:user:0", "20", "0.01", "1"])
        .query(&mut cc)
        .unwrap();
    assert_eq!(r[0..2], [1, 14]);
}

/// The buckets `automatic_failover...` writes, 300 of each kind:
/// (key prefix, max, rate, the write that set them up).
const KINDS: [(&str, &str, &str, [&str; 2]); 3] = [
    // Charged 3 of 20: 17 left.
    ("rl:some", "20", "0.01", ["TB.CONSUME", "3"]),
    // Drained: 0 left, a token per 1000 s.
    ("rl:drained", "5", "0.001", ["TB.CONSUME", "5"]),
    // In debt, floored at -max: -5.
    ("rl:debt", "5", "0.001", ["TB.ADJUST", "-8"]),
];

/// A key's (max, rate), from its prefix.
fn limits_of(key: &[u8]) -> (&'static str, &'static str) {
    let key = String::from_utf8_lossy(key);
    let (_, max, rate, _) = KINDS
        .iter()
        .find(|(prefix, ..)| key.starts_with(&format!("{prefix}:")))
        .unwrap_or_else(|| panic!("no kind for {key}"));
    (max, rate)
}

/// Automatic failover: a primary killed with SIGKILL, its replica promoted
/// by the cluster itself (a small cluster-node-timeout). Every bucket the
/// replica had acknowledged survives with its tokens, `ts` and absolute
/// expire time, and a call right after the failover gets no more than the
/// bucket held plus its refill since `ts`, by the servers' clocks: nothing
/// is minted. The old primary comes back as a replica of the new one.
#[test]
fn automatic_failover_after_kill_9_keeps_every_bucket_and_mints_nothing() {
    let mut cluster = Cluster::start(3, 1, Config::default().arg("cluster-node-timeout", "1000"));
    let mut cc = cluster.client();
    for i in 0..300 {
        for (prefix, max, rate, [command, amount]) in KINDS {
            let key = format!("{prefix}:{i}");
            let r: Vec<i64> = redis::cmd(command)
                .arg(&[key.as_str(), max, rate, amount])
                .query(&mut cc)
                .expect("a write through the cluster");
            assert_eq!(r[0], 1, "{command} {key}: {r:?}");
        }
    }

    // The primary to kill and its replica, once the replica holds every
    // write the primary acknowledged.
    let replica_port = cluster.replicas()[0].port;
    let replica_at = cluster
        .nodes
        .iter()
        .position(|n| n.port == replica_port)
        .unwrap();
    let primary_port = cluster.primary_of(&cluster.nodes[replica_at]).port;
    let primary_at = cluster
        .nodes
        .iter()
        .position(|n| n.port == primary_port)
        .unwrap();
    let mut p = cluster.nodes[primary_at].conn();
    wait_replicas(&mut p, 1);
    let before = snapshot(&mut p);
    assert!(
        before.len() > 100,
        "the shard holds {} buckets",
        before.len()
    );
    let others_before: BTreeMap<_, _> = cluster
        .primaries()
        .iter()
        .filter(|n| n.port != primary_port)
        .flat_map(|n| snapshot(&mut n.conn()))
        .collect();
    assert_eq!(others_before.len() + before.len(), 900);
    drop(p);

    cluster.nodes[primary_at].kill9();
    let promoted = &cluster.nodes[replica_at];
    let mut r = promoted.conn();
    let mut live: Vec<redis::Connection> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != primary_at)
        .map(|(_, n)| n.conn())
        .collect();
    // Promoted, and every live node has heard of it (a node that still
    // misses the dead primary's slots answers CLUSTERDOWN).
    let took_over = eventually(Duration::from_secs(60), || {
        info_field(&mut r, "replication", "role") == "master"
            && live.iter_mut().all(|c| {
                let state: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(c)
                    .unwrap_or_default();
                state.contains("cluster_state:ok")
            })
    });
    assert!(
        took_over,
        "the replica was not promoted:\n{}",
        promoted.log()
    );
    drop(live);

    // Every bucket, as it was: tokens, ts, absolute expire time.
    assert_eq!(snapshot(&mut r), before, "the promoted replica's buckets");
    let others_after: BTreeMap<_, _> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| {
            *i != primary_at && *i != replica_at && {
                let role = info_field(&mut n.conn(), "replication", "role");
                role == "master"
            }
        })
        .flat_map(|(_, n)| snapshot(&mut n.conn()))
        .collect();
    assert_eq!(others_after, others_before, "the other shards");

    // Right after the failover: a cost-1 call on each bucket sees at most
    // what it held plus the refill from its ts to the new primary's clock
    // after the call, and at least what it held.
    for (key, (hash, _)) in &before {
        let (max, rate) = limits_of(key);
        let held: f64 = hash["tokens"].parse().unwrap();
        let ts: i64 = hash["ts"].parse().unwrap();
        let reply: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg(key)
            .arg(&[max, rate, "1"])
            .query(&mut r)
            .expect("TB.CONSUME on the promoted replica");
        let now_us = server_time_us(&mut r);
        let (max, rate): (f64, f64) = (max.parse().unwrap(), rate.parse().unwrap());
        let most = (held + rate * (now_us - ts) as f64 / 1e6).min(max);
        let ctx = format!(
            "{}: held {held} at {ts}, {reply:?}",
            String::from_utf8_lossy(key)
        );
        if most < 1.0 {
            assert_eq!(reply[0], 0, "{ctx}: admitted, so tokens were minted");
        }
        if held >= 1.0 {
            assert_eq!(reply[0], 1, "{ctx}: denied, so tokens were lost");
        }
        let charged = reply[0] as f64;
        assert!(
            reply[1] as f64 <= (most - charged).floor()
                && reply[1] as f64 >= (held - charged).floor(),
            "{ctx}: at most {most} were there"
        );
    }

    // The killed primary comes back as a replica of the promoted one, and
    // takes its buckets, not its own.
    let config = cluster.nodes[primary_at].config.clone();
    cluster.nodes[primary_at].restart_with(config);
    cluster.wait_healthy(3);
    let mut old = cluster.nodes[primary_at].conn();
    assert_eq!(info_field(&mut old, "replication", "role"), "slave");
    assert_eq!(
        info_field(&mut old, "replication", "master_port"),
        replica_port.to_string()
    );
    wait_replicas(&mut r, 1);
    // A replica serves reads of its primary's slots once told READONLY.
    let _: () = redis::cmd("READONLY").query(&mut old).unwrap();
    assert_eq!(snapshot(&mut old), snapshot(&mut r));
}
