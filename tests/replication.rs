//! Effects replication: after thousands of mixed calls (buckets, quotas,
//! TB.CHARGE and reservations) a replica, with or without the module,
//! holds the primary's exact hashes and expire times.

use testkit::{
    bucket_delete, bucket_write, hgetall, info_field, run, server_time_us, snapshot, start_replica,
    wait_replicas, Config, ReplicationStream, Rng, Server,
};

fn mixed_traffic(c: &mut redis::Connection, seed: u64, calls: usize) {
    let mut rng = Rng(seed);
    let keys: Vec<String> = (0..50).map(|i| format!("rl:{i}")).collect();
    for _ in 0..calls {
        let k = &keys[(rng.next() % 50) as usize];
        let max = *rng.pick(&["5", "10", "2.5"]);
        // Slow refill: no bucket can come within seconds of full (and expire)
        // while the two datasets are being compared.
        let rate = *rng.pick(&["0.001", "0.002", "0.005"]);
        // Quotas on keys of their own, in fixed periods of 31 years: none
        // ends while the datasets are compared.
        let q = format!("q:{}", rng.next() % 20);
        let q = q.as_str();
        let period = "1000000000";
        let r: redis::RedisResult<redis::Value> = match rng.next() % 10 {
            6 => redis::cmd("TB.QUOTA")
                .arg(&[q, "100", period, *rng.pick(&["1", "0", "7.5"])])
                .query(c),
            7 => redis::cmd("TB.QADJUST")
                .arg(&[q, "100", period, *rng.pick(&["-3", "1.5", "400"])])
                .query(c),
            8 => redis::cmd("TB.CHARGE")
                .arg(&["2", k.as_str(), q, "WAIT", "5000", "BUCKET", max, rate, "1"])
                .arg(&["QUOTA", "100", period, "1"])
                .query(c),
            9 => redis::cmd("TB.CONSUME")
                .arg(&[k.as_str(), max, rate, "2", "WAIT", "60000"])
                .query(c),
            0 => redis::cmd("TB.PEEK").arg(&[k.as_str(), max, rate]).query(c),
            1 => redis::cmd("TB.ADJUST")
                .arg(&[
                    k.as_str(),
                    max,
                    rate,
                    *rng.pick(&["-3", "1.5", "-0.25", "7"]),
                ])
                .query(c),
            2 => {
                let k2 = &keys[(rng.next() % 50) as usize];
                let k2 = if k2 == k { "rl:other" } else { k2.as_str() };
                redis::cmd("TB.MCONSUME")
                    .arg(&[k.as_str(), max, rate, "1", k2, "5", "0.002", "2"])
                    .query(c)
            }
            _ => redis::cmd("TB.CONSUME")
                .arg(&[k.as_str(), max, rate, *rng.pick(&["1", "0", "2.5", "0.3"])])
                .query(c),
        };
        r.expect("valid traffic never errors");
    }
}

fn replica_matches_primary(replica_config: Config) {
    let s = Server::start();
    let replica = start_replica(&s, replica_config);
    let mut p = s.conn();
    mixed_traffic(&mut p, 42, 3000);
    wait_replicas(&mut p, 1);
    let primary_state = snapshot(&mut p);
    let replica_state = snapshot(&mut replica.conn());
    assert!(primary_state.len() > 10, "traffic left buckets behind");
    assert!(primary_state
        .values()
        .all(|(h, at)| h.len() == 2 && *at > 0));
    assert_eq!(primary_state, replica_state);
}

#[test]
fn replica_with_the_module_is_identical() {
    replica_matches_primary(Config::default());
}

#[test]
fn replica_without_the_module_is_identical() {
    replica_matches_primary(Config::without_module());
}

#[test]
fn replica_attached_mid_traffic_ends_identical() {
    let s = Server::start();
    let url = s.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut seed = 7;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                mixed_traffic(&mut c, seed, 200);
                seed += 1;
            }
            // WAIT from the connection that wrote: its writes are acked.
            wait_replicas(&mut c, 1);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Full sync while writes keep coming.
    let replica = start_replica(&s, Config::default());
    std::thread::sleep(std::time::Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.join().unwrap();
    let mut p = s.conn();
    wait_replicas(&mut p, 1);
    assert!(
        info_field(
            &mut replica.conn(),
            "replication",
            "master_sync_in_progress"
        ) == "0"
    );
    let primary = snapshot(&mut p);
    assert!(primary.len() > 10);
    assert_eq!(snapshot(&mut replica.conn()), primary);
}

/// The stream replicas and the AOF receive, read as a replica reads it:
/// each write is exactly `HSET key tokens <t> ts <ts>` and `PEXPIREAT key
/// <ms>` with the text the primary stored (`DEL key` for a bucket that
/// filled up, and before the first write of a key redis-cell left), and a
/// call that writes nothing (a denial, cost 0, TB.PEEK, a refund of a full
/// bucket, an error) sends nothing.
#[test]
fn the_stream_carries_exactly_the_stored_hash_and_expire_time() {
    let s = Server::start();
    let mut c = s.conn();
    let mut stream = ReplicationStream::attach(&s);
    let _: () = redis::cmd("SET")
        .arg("legacy")
        .arg(((server_time_us(&mut c) + 6_000_000) * 1000).to_string())
        .query(&mut c)
        .unwrap();
    assert_eq!(stream.take_commands(&mut c)[0][..2], ["SET", "legacy"]);
    type Expected = fn(&mut redis::Connection) -> Vec<Vec<String>>;
    let nothing: Expected = |_| Vec::new();
    // One call a line: its arguments, then what it must replicate.
    #[rustfmt::skip]
    let cases: [(&[&str], Expected); 13] = [
        (&["TB.CONSUME", "a", "10", "0.001", "3"], |c| bucket_write(c, "a")),
        (&["TB.CONSUME", "a", "10", "0.001", "2.5"], |c| bucket_write(c, "a")),
        (&["TB.CONSUME", "a", "10", "0.001", "9"], nothing),
        (&["TB.CONSUME", "a", "10", "0.001", "0"], nothing),
        (&["TB.PEEK", "a", "10", "0.001"], nothing),
        (&["TB.CONSUME", "a", "x", "0.001"], nothing),
        (&["TB.ADJUST", "a", "10", "0.001", "-1"], |c| bucket_write(c, "a")),
        (&["TB.ADJUST", "a", "10", "0.001", "100"], |_| bucket_delete("a")),
        (&["TB.ADJUST", "a", "10", "0.001", "5"], nothing),
        (&["TB.MCONSUME", "b", "5", "0.001", "1", "c", "5", "0.001", "2"], |c| {
            [bucket_write(c, "b"), bucket_write(c, "c")].concat()
        }),
        (&["TB.MCONSUME", "b", "5", "0.001", "1", "c", "5", "0.001", "4"], nothing),
        (&["CL.THROTTLE", "legacy", "15", "30", "60", "0"], nothing),
        (&["CL.THROTTLE", "legacy", "15", "30", "60"], |c| {
            [bucket_delete("legacy"), bucket_write(c, "legacy")].concat()
        }),
    ];
    for (args, expected) in cases {
        let _ = run(&mut c, redis::cmd(args[0]).arg(&args[1..]));
        let want = expected(&mut c);
        assert_eq!(stream.take_commands(&mut c), want, "{args:?}");
    }
    assert_eq!(hgetall(&mut c, "b")["tokens"], "4", "the calls ran");
}
