//! Redis Cluster: three primaries with a replica each, the module on every
//! node. Traffic spreads over the shards, MCONSUME needs one slot, and a
//! manual failover keeps every bucket.

use std::collections::BTreeMap;
use testkit::{cluster::Cluster, dbsize, error_of, snapshot, wait_replicas, Config};

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

    // Manual failover of every shard: no bucket lost, none reset to full.
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
