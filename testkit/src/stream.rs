//! A server's replication stream, read as a replica receives it: a raw
//! connection that sends `SYNC`, skips the RDB snapshot and then reads the
//! commands the server propagates.

use crate::client::eventually;
use crate::server::Server;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The key `ReplicationStream::take` writes to mark where it stops.
pub const STREAM_MARKER: &str = "tb-test:stream-marker";

/// It acknowledges nothing past the snapshot: `WAIT` does not count it,
/// and `wait_replicas`, which wants every replica caught up, would wait
/// for it in vain.
pub struct ReplicationStream {
    reader: BufReader<TcpStream>,
}

impl ReplicationStream {
    /// Attaches to `server` as a replica would, and returns once the
    /// server streams to it: what follows is the stream of commands.
    pub fn attach(server: &Server) -> ReplicationStream {
        ReplicationStream::attach_ticking(server, || {})
    }

    /// `attach` for a server on a frozen fake clock: the server hands the
    /// snapshot over in its cron, which runs only while the clock moves,
    /// so `tick` moves it (a millisecond or so) while this waits.
    ///
    /// It announces `capa eof`, so the server streams the snapshot from its
    /// fork, ended by a random 40-byte mark, and starts the stream once the
    /// replica is online and has acknowledged.
    pub fn attach_ticking(server: &Server, mut tick: impl FnMut()) -> ReplicationStream {
        let mut s = TcpStream::connect(("127.0.0.1", server.port)).expect("connect for SYNC");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        s.write_all(b"REPLCONF capa eof\r\n")
            .expect("send REPLCONF");
        let mut reader = BufReader::new(s);
        assert_eq!(read_line(&mut reader), "+OK", "REPLCONF capa eof");
        // Only now: SYNC with a reply still unread is refused.
        reader.get_mut().write_all(b"SYNC\r\n").expect("send SYNC");
        let mut line = read_line(&mut reader);
        // Newlines keep the link alive while the server forks.
        while line.is_empty() {
            line = read_line(&mut reader);
        }
        let mark = line
            .strip_prefix("$EOF:")
            .unwrap_or_else(|| panic!("SYNC: expected a snapshot, got {line:?}"))
            .as_bytes()
            .to_vec();
        let mut tail = Vec::with_capacity(mark.len() + 1);
        let mut byte = [0u8];
        while tail != mark {
            reader.read_exact(&mut byte).expect("read the snapshot");
            if tail.len() == mark.len() {
                tail.remove(0);
            }
            tail.push(byte[0]);
        }
        // An acknowledgement before the server has put the replica online
        // is ignored, and without one it never starts the stream.
        let mut c = server.conn();
        let online = eventually(Duration::from_secs(30), || {
            tick();
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut c)
                .expect("INFO replication");
            let replicas: Vec<&str> = info.lines().filter(|l| l.starts_with("slave")).collect();
            !replicas.is_empty() && replicas.iter().all(|l| l.contains("state=online"))
        });
        assert!(online, "the SYNC connection never came online");
        reader
            .get_mut()
            .write_all(b"REPLCONF ACK 0\r\n")
            .expect("send REPLCONF ACK");
        ReplicationStream { reader }
    }

    /// Every command propagated since the last `take` (or `attach`), in
    /// order, up to a marker this call writes through `c` (`SET` of
    /// `STREAM_MARKER`, left in the dataset) and without it. The server's
    /// keep-alive `PING`s and `REPLCONF` requests are left out; `SELECT`,
    /// `MULTI` and `EXEC` are kept.
    pub fn take(&mut self, c: &mut redis::Connection) -> Vec<Vec<String>> {
        static N: AtomicU64 = AtomicU64::new(0);
        let mark = N.fetch_add(1, Ordering::Relaxed).to_string();
        let _: () = redis::cmd("SET")
            .arg(STREAM_MARKER)
            .arg(&mark)
            .query(c)
            .expect("SET the stream marker");
        let mut out = Vec::new();
        loop {
            let command = self.next_command();
            let name = command[0].to_ascii_uppercase();
            if name == "SET" && command[1..] == [STREAM_MARKER, mark.as_str()] {
                return out;
            }
            if name != "PING" && name != "REPLCONF" {
                out.push(command);
            }
        }
    }

    /// `take` without the `SELECT`s and the `MULTI`/`EXEC` around a
    /// command's effects: the commands alone.
    pub fn take_commands(&mut self, c: &mut redis::Connection) -> Vec<Vec<String>> {
        let mut all = self.take(c);
        all.retain(|cmd| !["SELECT", "MULTI", "EXEC"].contains(&cmd[0].to_uppercase().as_str()));
        all
    }

    /// One command of the stream (a RESP array of bulk strings), each
    /// argument as text (bytes that are not UTF-8 replaced).
    fn next_command(&mut self) -> Vec<String> {
        let header = read_line(&mut self.reader);
        let n: usize = header
            .strip_prefix('*')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("replication stream: expected a command, got {header:?}"));
        (0..n)
            .map(|_| {
                let len: usize = read_line(&mut self.reader)
                    .strip_prefix('$')
                    .and_then(|n| n.parse().ok())
                    .expect("replication stream: a bulk string");
                let mut arg = vec![0; len + 2];
                self.reader
                    .read_exact(&mut arg)
                    .expect("replication stream: read an argument");
                arg.truncate(len);
                String::from_utf8_lossy(&arg).into_owned()
            })
            .collect()
    }
}

/// One line, without its line ending.
fn read_line(reader: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    let n = reader
        .read_line(&mut line)
        .expect("read from the replication stream");
    assert!(n > 0, "the server closed the replication stream");
    line.trim_end_matches(['\r', '\n']).to_string()
}

/// The commands a write of the bucket `key` replicates: `HSET key tokens
/// <t> ts <ts>` and `PEXPIREAT key <ms>`, with the hash and expire time the
/// server holds now.
pub fn bucket_write(c: &mut redis::Connection, key: &str) -> Vec<Vec<String>> {
    let h = crate::client::hgetall(c, key);
    let at = crate::client::int(c, "PEXPIRETIME", key).to_string();
    vec![
        words(&["HSET", key, "tokens", &h["tokens"], "ts", &h["ts"]]),
        words(&["PEXPIREAT", key, &at]),
    ]
}

/// `DEL key`, as the stream carries it.
pub fn bucket_delete(key: &str) -> Vec<Vec<String>> {
    vec![words(&["DEL", key])]
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}
