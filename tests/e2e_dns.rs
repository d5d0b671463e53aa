//! Name lookups hold up only their own outlet (issue 7: no lookup blocks the sending loop). Node A's app has a
//! link, a wire and a webhook given by a name that does not resolve — its name server answers NXDOMAIN — or whose
//! name server never answers (a UDP socket this test binds and never reads back from), beside a link and a wire to
//! node B given by IP address, which need no lookup. The good outlets deliver everything, twice over, while the bad
//! ones are still resolving or failing: their `pure_outlet_errors_total{kind="dns"}` grows and their lag stays.
//! Structural checks only: nothing is timed. The name servers are the test's own on 127.0.0.1 (`--dns`), so no
//! lookup leaves the machine.

mod ops_util;
mod outlet_util;

use std::sync::atomic::Ordering;

use ops_util::{NodeProcess, keygen};
use outlet_util::{
    FakeDns, args, assert_each_once_forwarded, assert_sent, errors, lag, node_files, records,
    spawn_send, start, wait_until,
};

const GOOD: [(&str, &str); 2] = [("good-link", "link"), ("good-wire", "wire")];
const BAD: [(&str, &str); 3] = [
    ("bad-link", "link"),
    ("bad-wire", "wire"),
    ("bad-hook", "webhook"),
];

/// `asked`: whether the name server must have been asked (hickory answers a `.invalid` name itself, RFC 6761).
fn bad_outlets_wait_while_good_ones_deliver(dns: FakeDns, name: &str, asked: bool) {
    const ROUND: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let (state_a, state_b) = (dir.path().join("a"), dir.path().join("b"));
    let (key_a, pub_a) = keygen(dir.path(), "node-a");
    let (key_dev, pub_dev) = keygen(dir.path(), "dev0");

    let (senders_b, apps_b) = node_files(
        dir.path(),
        "b",
        &format!("node-a {pub_a}\n"),
        "[apps.good-link]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n\
         [apps.good-wire]\naccept = [\"node-a\"]\nforwarders = [\"node-a\"]\n",
    );
    let b = start(
        &state_b,
        &args(&[
            "--senders",
            senders_b.to_str().unwrap(),
            "--apps",
            apps_b.to_str().unwrap(),
        ]),
        0,
        0,
    );

    let (senders_a, apps_a) = node_files(
        dir.path(),
        "a",
        &format!("dev0 {pub_dev}\n"),
        &format!(
            "[apps.main]\n\
             [apps.main.outlets.good-link]\nkind = \"link\"\nto = \"{link_b}\"\nnode_key = \"{key}\"\napp = \"good-link\"\n\
             [apps.main.outlets.good-wire]\nkind = \"wire\"\nurl = \"http://{http_b}/link\"\nnode_key = \"{key}\"\n\
             app = \"good-wire\"\n\
             [apps.main.outlets.bad-link]\nkind = \"link\"\nto = \"{name}:7380\"\nnode_key = \"{key}\"\napp = \"bad-link\"\n\
             [apps.main.outlets.bad-wire]\nkind = \"wire\"\nurl = \"http://{name}:7381/link\"\nnode_key = \"{key}\"\n\
             app = \"bad-wire\"\n\
             [apps.main.outlets.bad-hook]\nkind = \"webhook\"\nurl = \"http://{name}:8080/hook\"\n",
            link_b = b.link,
            http_b = b.http,
            key = b.public_key,
        ),
    );
    let a = start(
        &state_a,
        &args(&[
            "--key",
            key_a.to_str().unwrap(),
            "--senders",
            senders_a.to_str().unwrap(),
            "--apps",
            apps_a.to_str().unwrap(),
            "--dns",
            &dns.addr.to_string(),
        ]),
        0,
        0,
    );

    let send_round = |round: u64| {
        let mut send = spawn_send(&key_dev, &a, "main", 60);
        // Records of round 2 follow round 1's: the device's flow is one sequence.
        let mut stdin = send.stdin.take().unwrap();
        use std::io::Write;
        let mut text = String::new();
        for k in (round - 1) * ROUND + 1..=round * ROUND {
            text.push_str(&format!("dev0 line {k}\n"));
        }
        stdin.write_all(text.as_bytes()).unwrap();
        drop(stdin);
        assert_sent(send, "dev0");
    };
    let good_done = |a: &NodeProcess, upto: u64| {
        GOOD.iter().all(|(o, k)| lag(a, "main", o, k) == Some(0.0))
            && GOOD
                .iter()
                .all(|(o, _)| records(&state_b, o).len() as u64 >= upto)
    };
    let dns_errors = |a: &NodeProcess| -> Vec<f64> {
        BAD.iter()
            .map(|(o, _)| errors(a, "main", o, "dns"))
            .collect()
    };

    // Round 1: the good outlets deliver everything; the bad ones have sent nothing.
    send_round(1);
    wait_until("the good outlets to deliver round 1", || {
        good_done(&a, ROUND)
    });
    for (o, k) in BAD {
        assert_eq!(
            lag(&a, "main", o, k),
            Some(ROUND as f64),
            "{o}: nothing sent"
        );
    }
    eprintln!(
        "round 1 delivered; dns errors of the bad outlets so far: {:?}",
        dns_errors(&a)
    );
    wait_until("a DNS error on every bad outlet", || {
        dns_errors(&a).iter().all(|&e| e >= 1.0)
    });
    let after_1 = dns_errors(&a);

    // Round 2, while the bad outlets keep failing: the good ones deliver it too, and the bad ones are still where
    // they were, failing again.
    send_round(2);
    wait_until("the good outlets to deliver round 2", || {
        good_done(&a, 2 * ROUND)
    });
    for (o, k) in BAD {
        assert_eq!(
            lag(&a, "main", o, k),
            Some(2.0 * ROUND as f64),
            "{o}: nothing sent"
        );
    }
    wait_until("the DNS errors of every bad outlet to grow", || {
        dns_errors(&a)
            .iter()
            .zip(&after_1)
            .all(|(now, before)| now > before)
    });
    for (o, _) in BAD {
        for other in ["connect", "tls", "http", "timeout", "socket"] {
            assert_eq!(errors(&a, "main", o, other), 0.0, "{o}: only DNS fails");
        }
    }
    for (o, _) in GOOD {
        assert_each_once_forwarded(&records(&state_b, o), &["dev0"], 2 * ROUND, "node-a");
        assert_eq!(errors(&a, "main", o, "dns"), 0.0, "{o} needs no lookup");
    }
    if asked {
        assert!(
            dns.asked_for(name),
            "asked for {name}: {:?}",
            dns.names.lock().unwrap()
        );
    } else {
        eprintln!(
            "the name server got {} queries",
            dns.queries.load(Ordering::Relaxed)
        );
    }
    let stderr = a.stderr_text();
    assert!(
        stderr.contains(&format!("name {name} did not resolve")),
        "the log says which name: {stderr}"
    );
    // In words, not a debug dump of one of hickory's queries (issue 18, item 7).
    assert!(
        !stderr.contains("query_type") && !stderr.contains("Query {"),
        "{stderr}"
    );
    if !asked {
        assert!(stderr.contains("no such name"), "{stderr}");
    }
    drop(b);
}

#[test]
fn a_name_that_does_not_resolve_holds_up_only_its_own_outlets() {
    bad_outlets_wait_while_good_ones_deliver(FakeDns::nxdomain(), "no-such-host.invalid", false);
}

#[test]
fn a_name_server_that_never_answers_holds_up_only_its_own_outlets() {
    bad_outlets_wait_while_good_ones_deliver(FakeDns::silent(), "never-answered.example", true);
}
