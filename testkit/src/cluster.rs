//! A real Redis Cluster on loopback: N primaries, each with R replicas,
//! created with `redis-cli --cluster create`.

use crate::client::{eventually, info_field};
use crate::server::{Config, Server};
use std::process::Command;
use std::time::Duration;

pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// `config` may set its own `cluster-node-timeout` (3 s otherwise).
    pub fn start(primaries: usize, replicas: usize, config: Config) -> Cluster {
        let mut config = config
            .arg("cluster-enabled", "yes")
            .arg("cluster-config-file", "nodes.conf");
        if !config.args.iter().any(|a| a == "--cluster-node-timeout") {
            config = config.arg("cluster-node-timeout", "3000");
        }
        let nodes: Vec<Server> = (0..primaries * (1 + replicas))
            .map(|_| Server::with(config.clone()))
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = cmd
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        cluster.wait_healthy(primaries);
        cluster
    }

    /// Waits until every node sees a healthy cluster with `primaries`
    /// primaries and every replica's link is up.
    pub fn wait_healthy(&self, primaries: usize) {
        for n in &self.nodes {
            let mut c = n.conn();
            let ok = eventually(Duration::from_secs(60), || {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .unwrap_or_default();
                let role = info_field(&mut c, "replication", "role");
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut c)
                    .unwrap_or_default();
                // Every node must know every other one, or it can't vote.
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_size:{primaries}"))
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && !nodes.contains("handshake")
                    && !nodes.contains("fail")
                    && (role == "master"
                        || info_field(&mut c, "replication", "master_link_status") == "up")
            });
            assert!(ok, "node {} not healthy:\n{}", n.port, n.log());
        }
        // Roles settle after a failover: the old primary turns replica.
        assert!(
            eventually(Duration::from_secs(30), || self.primaries().len()
                == primaries),
            "primaries did not settle"
        );
    }

    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(Server::url).collect();
        redis::cluster::ClusterClient::new(urls)
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    fn role(n: &Server) -> String {
        info_field(&mut n.conn(), "replication", "role")
    }

    pub fn primaries(&self) -> Vec<&Server> {
        self.nodes
            .iter()
            .filter(|n| Self::role(n) == "master")
            .collect()
    }

    pub fn replicas(&self) -> Vec<&Server> {
        self.nodes
            .iter()
            .filter(|n| Self::role(n) == "slave")
            .collect()
    }

    /// The primary a replica follows.
    pub fn primary_of(&self, replica: &Server) -> &Server {
        let port: u16 = info_field(&mut replica.conn(), "replication", "master_port")
            .parse()
            .expect("master_port");
        self.nodes.iter().find(|n| n.port == port).expect("primary")
    }

    /// `CLUSTER FAILOVER` on `replica`, retried while the election can't
    /// reach a majority yet (votes are refused for a while after a node
    /// joined or voted).
    pub fn failover(&self, replica: &Server) {
        let mut r = replica.conn();
        for _ in 0..5 {
            let _: String = redis::cmd("CLUSTER")
                .arg("FAILOVER")
                .query(&mut r)
                .expect("CLUSTER FAILOVER");
            if eventually(Duration::from_secs(15), || {
                info_field(&mut r, "replication", "role") == "master"
            }) {
                return;
            }
        }
        panic!(
            "failover of {} did not complete:\n{}",
            replica.port,
            replica.log()
        );
    }
}
