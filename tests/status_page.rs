//! The status page in a real browser (issue 19, item 5): Chromium, headless, driven by chromedriver over the
//! WebDriver HTTP API (a small client below: JSON over HTTP/1.1 on loopback). A node with two apps and three
//! outlets, a webhook and a link to a port where nothing listens and an inner one that works, serves the page; the test checks that it renders, that
//! its figures are those of `/metrics`, that the failing outlet is shown failing with its reason and what to do,
//! that the header then says DEGRADED (not the green OK) with each issue listed, and that the rate chart moves
//! while records flow, all without reloading the page; and, once the node is stopped, that the page says NOT
//! UPDATING and dims what it shows.
//!
//! Chromium and chromedriver are Debian's packages (`.ci/run` installs them). Without them the test says
//! "skipped" and passes, unless `PURE_REQUIRE_BROWSER` is set (CI sets it), when their absence fails it.
//! With `STATUS_PAGE_SCREENSHOT=PATH` it also writes the page's screenshot there (README.md shows
//! docs/status-page.png, made so).

mod ops_util;
mod outlet_util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use ops_util::*;
use serde_json::{Value, json};

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// One HTTP/1.1 request to chromedriver, JSON both ways.
fn webdriver(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Value {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // chromedriver says `Connection: close` and then keeps the connection open: read by Content-Length.
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let (head, rest) = loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "chromedriver closed without an answer");
        raw.extend_from_slice(&buf[..n]);
        let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&raw[..end]).to_string();
        let body = &raw[end + 4..];
        let length = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        });
        match length {
            Some(len) if body.len() >= len => {
                break (head, String::from_utf8_lossy(&body[..len]).to_string());
            }
            Some(_) => continue,
            None if head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked") =>
            {
                if body.ends_with(b"0\r\n\r\n") {
                    break (head, unchunk(&String::from_utf8_lossy(body)));
                }
            }
            None => panic!("no Content-Length from chromedriver: {head}"),
        }
    };
    let v: Value = serde_json::from_str(&rest).unwrap_or_else(|e| panic!("{e}: {rest}"));
    if head.split_whitespace().nth(1) != Some("200") {
        panic!("webdriver {method} {path}: {head}\n{v}");
    }
    v["value"].clone()
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// chromedriver and one browser session; both end when dropped.
struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start(chromium: &Path, chromedriver: &Path) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // A process group of its own: the browser it starts goes with it, whatever happens to the session.
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + DEADLINE;
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    "--disable-dev-shm-usage", "--window-size=1280,1500",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let v = webdriver(addr, "POST", "/session", Some(&caps));
        browser.session = v["sessionId"].as_str().unwrap().to_string();
        browser
    }

    fn call(&self, method: &str, what: &str, body: Option<&Value>) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        webdriver(self.addr, method, &path, body)
    }

    fn open(&self, url: &str) {
        self.call("POST", "url", Some(&json!({ "url": url })));
    }

    fn run(&self, script: &str) -> Value {
        self.call(
            "POST",
            "execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call("GET", "screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = std::panic::catch_unwind(|| webdriver(self.addr, "DELETE", &path, None));
        }
        // SAFETY: kill(2) of the process group this test made for chromedriver and its browser.
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// Every figure on the page, as the operator reads it: `page` for the node's, and one object per card (app or
/// outlet) with its class, its figures by `data-k`, and its chart's points.
const READ_PAGE: &str = r##"
const page = {}, cards = {};
for (const e of document.querySelectorAll("[data-k]")) {
  if (!e.closest("[data-card]")) page[e.dataset.k] = e.textContent;
}
for (const c of document.querySelectorAll("[data-card]")) {
  const o = {class: c.className};
  for (const e of c.querySelectorAll("[data-k]")) {
    o[e.dataset.k] = e.dataset.k === "chart" ? e.getAttribute("data-points") : e.textContent;
  }
  cards[c.dataset.card] = o;
}
const health = document.getElementById("health");
return {page, cards, updated: document.body.dataset.updated || null, marker: window.__marker || null,
        text: document.body.innerText, health: health.textContent, health_class: health.className,
        health_colour: getComputedStyle(health).color,
        issues: [...document.querySelectorAll("#problems li")].map(li => [li.dataset.issue, li.textContent]),
        stale: document.body.classList.contains("stale"),
        devices_class: document.getElementById("devices").className,
        quietest: [...document.querySelectorAll("#quietest tr[data-sender]")].map(r => [...r.cells].map(c => c.textContent)),
        found: [...document.querySelectorAll("#found tr[data-sender]")].map(r => [...r.cells].map(c => c.textContent)),
        charts: [...document.querySelectorAll("svg.chart")].map(s => [s.viewBox.baseVal.width, s.clientWidth]),
        opacity: Number(getComputedStyle(document.querySelector("main")).opacity)};
"##;

fn number(text: &str) -> f64 {
    let digits: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
        .filter(|c| *c != ',')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {text:?}"))
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_status_page_in_a_real_browser() {
    let (Some(chromium), Some(chromedriver)) = (
        on_path("chromium").or_else(|| on_path("chromium-browser")),
        on_path("chromedriver"),
    ) else {
        assert!(
            std::env::var_os("PURE_REQUIRE_BROWSER").is_none(),
            "PURE_REQUIRE_BROWSER is set but chromium or chromedriver is not on PATH (apt-get install chromium \
             chromium-driver)"
        );
        eprintln!(
            "status_page: skipped — chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        );
        return;
    };

    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "dev");
    let senders = dir.path().join("senders");
    // Two more senders that never send: the devices panel counts them as never heard, and finds them by name.
    let (_, boiler) = keygen(dir.path(), "boiler");
    let (_, gauge) = keygen(dir.path(), "gauge");
    write_atomic(
        &senders,
        &format!("dev {public}\nBoiler-42 {boiler}\ngauge-17 {gauge}\n"),
    );
    // Nothing listens on this port: the webhook fails to connect, and says so.
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_port = down.local_addr().unwrap().port();
    drop(down);
    let apps = dir.path().join("apps.toml");
    write_atomic(
        &apps,
        &format!(
            "[apps.sensors]\n\
             [apps.sensors.outlets.cloud]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{down_port}/ingest?token=s3cret\"\n\
             [apps.sensors.outlets.relay]\nkind = \"link\"\nto = \"127.0.0.1:{down_port}\"\n\
             node_key = \"daMGbrvtfNPfdX0m7LxP65QWRxE6CrjCt7+W4FtVWgA=\"\n\
             [apps.sensors.outlets.archive]\nkind = \"app\"\napp = \"archive\"\n\
             [apps.archive]\naccept = []\n"
        ),
    );
    let node = NodeProcess::start(
        &dir.path().join("state"),
        &[
            "--senders",
            senders.to_str().unwrap(),
            "--apps",
            apps.to_str().unwrap(),
            // Quiet soon after its last record, so the test sees a sender go quiet (the default is 1h).
            "--quiet-after",
            "3s",
        ],
        None,
    );

    let browser = Browser::start(&chromium, &chromedriver);
    browser.open(&format!("http://{}/", node.metrics));
    // A mark that survives only as long as the document does: the page must update itself, not be reloaded.
    browser.run("window.__marker = 'same document'; return null;");
    let read = || browser.run(READ_PAGE);
    wait_for("the page to render the node's figures", || {
        let v = read();
        v["updated"].is_string() && v["cards"]["sensors/cloud"].is_object()
    });
    let v = read();
    assert_eq!(v["page"]["node_key"], json!(node.public_key), "{v}");
    assert_eq!(v["page"]["version"], json!(env!("CARGO_PKG_VERSION")));
    // The host (issue 37, §4): memory, the disk, each store's size, the CPU's temperature or that there is none.
    let host = |k: &str| v["page"][k].as_str().unwrap_or("").to_string();
    assert!(
        host("host.memory").contains("resident") && host("host.memory").contains("anonymous"),
        "{v}"
    );
    assert!(
        host("host.disk").contains("free of") && host("host.disk").contains("written since start"),
        "{v}"
    );
    assert!(host("host.stores").contains("sensors "), "{v}");
    assert!(
        host("host.cpu").ends_with("°C") || host("host.cpu") == "no temperature on this host",
        "{v}"
    );
    assert!(
        v["page"]["listens"]
            .as_str()
            .unwrap()
            .contains(&node.link.to_string()),
        "{v}"
    );

    // Records flow for about 8 s: the chart of the app moves while they do, without a reload.
    let mut send = outlet_util::spawn_send(&key, &node, "sensors", 60);
    let total = 3_200;
    let feeder = outlet_util::feed_lines(&mut send, "dev", total, 40, Duration::from_millis(100));
    wait_for("the page to show records stored per second", || {
        let v = read();
        let rate = v["cards"]["sensors"]["rate"].as_str().unwrap_or("");
        rate.ends_with("/s") && number(rate) > 0.0
    });
    let before = read()["cards"]["sensors"]["chart"].clone();
    wait_for("the rate chart to move while records flow", || {
        read()["cards"]["sensors"]["chart"] != before
    });
    let moving = read();
    assert_eq!(
        moving["marker"],
        json!("same document"),
        "the page was reloaded"
    );
    assert_ne!(moving["cards"]["sensors"]["chart"], json!(""), "{moving}");
    // Each chart is drawn at its own width (issue 37: its labels were squeezed to about 8 px): viewBox = pixels.
    for c in moving["charts"].as_array().unwrap() {
        let (view, pixels) = (c[0].as_f64().unwrap(), c[1].as_f64().unwrap());
        assert!(pixels < 160.0 || (view - pixels).abs() <= 1.0, "{c}");
    }
    feeder.join().unwrap();
    outlet_util::assert_sent(send, "the records for the page");

    // Once everything is stored and the inner outlet caught up, the page's figures are those of /metrics.
    wait_for("both apps to store everything", || {
        node.metric("pure_records_stored_total{app=\"sensors\"}") == Some(total as f64)
            && node.metric("pure_records_stored_total{app=\"archive\"}") == Some(total as f64)
    });
    wait_for("the page to show what /metrics shows", || {
        let v = read();
        let c = &v["cards"];
        c["sensors"]["stored_total"].as_str().map(number) == Some(total as f64)
            && c["archive"]["stored_total"].as_str().map(number) == Some(total as f64)
            && c["sensors/archive"]["lag"]
                .as_str()
                .is_some_and(|l| l.starts_with("0 records"))
    });
    // Devices (issue 37, §1): once `dev` has been silent for --quiet-after, the census counts it quiet, lists it
    // first among the quietest with what the store holds of it, and the two that never sent as never heard.
    wait_for("the devices panel to count dev as quiet", || {
        let v = read();
        v["page"]["devices.quiet"]
            .as_str()
            .is_some_and(|q| q.starts_with("1 heard before, silent for 3 s or longer"))
    });
    let v = read();
    assert_eq!(v["page"]["devices.never"], json!("2 of 3"), "{v}");
    assert_eq!(v["page"]["devices.hour"], json!("1 of 3"), "{v}");
    assert_eq!(v["page"]["devices.day"], json!("1 of 3"), "{v}");
    let quietest = v["quietest"].as_array().unwrap();
    assert_eq!(quietest.len(), 1, "{v}");
    assert_eq!(quietest[0][0], json!("dev"));
    assert!(quietest[0][1].as_str().unwrap().starts_with("20"), "{v}");
    assert_eq!(
        number(quietest[0][3].as_str().unwrap()),
        total as f64,
        "{v}"
    );
    assert!(v["devices_class"].as_str().unwrap().contains("warn"), "{v}");
    assert_eq!(node.metric("pure_senders_quiet"), Some(1.0));
    assert_eq!(node.metric("pure_senders_never_heard"), Some(2.0));
    assert_eq!(node.metric("pure_senders_heard_last_hour"), Some(1.0));
    assert_eq!(node.metric("pure_senders_quiet_after_seconds"), Some(3.0));
    // The search by name: letters in either case, each match looked up in the stores.
    let search = |text: &str| {
        browser.run(&format!(
            "document.getElementById('device-name').value = {text:?}; \
             document.querySelector('#device-search button').click(); return null;"
        ));
    };
    search("BOILER");
    wait_for("the search to find Boiler-42", || {
        read()["found"] == json!([["Boiler-42", "never", "–", "0"]])
    });
    assert_eq!(read()["page"]["devices.found"], json!("1 found"));
    search("De");
    wait_for("the search to find dev", || {
        let f = read()["found"].clone();
        f.as_array().is_some_and(|rows| {
            rows.len() == 1
                && rows[0][0] == "dev"
                && rows[0][3].as_str().map(number) == Some(total as f64)
        })
    });
    search("nobody-by-that-name");
    wait_for("the search to say none matched", || {
        read()["page"]["devices.found"]
            .as_str()
            .is_some_and(|t| t.starts_with("no sender's name contains"))
    });
    let (code, body) = node.http_get("/devices.json?name=gauge");
    assert_eq!(code, 200, "{body}");
    let found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(found["senders"][0]["name"], json!("gauge-17"), "{found}");
    assert_eq!(found["senders"][0]["last_seen_ms"], json!(null), "{found}");
    assert_eq!(node.http_get("/devices.json").0, 400);

    // Downlink: two records pushed for `dev` wait for it, on the page as in /metrics.
    let (code, said) = ops_util::push(&node.state, "sensors", "dev", b"rate=10\nreboot\n");
    assert_eq!(code, 0, "{said}");
    wait_for("the page to show the downlink records waiting", || {
        read()["cards"]["sensors"]["downlink"]
            .as_str()
            .is_some_and(|d| {
                d.starts_with("2 waiting · 2 queued, 0 delivered, 0 expired, 0 refused")
            })
    });
    assert_eq!(
        node.metric("pure_downlink_waiting{app=\"sensors\"}"),
        Some(2.0)
    );
    let v = read();
    let metrics = node.http_get("/metrics").1;
    let metric = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} not in /metrics:\n{metrics}"))
    };
    let (page, cards) = (&v["page"], &v["cards"]);
    for app in ["sensors", "archive"] {
        assert_eq!(
            number(cards[app]["stored_total"].as_str().unwrap()),
            metric(&format!("pure_records_stored_total{{app=\"{app}\"}}")),
            "{app}"
        );
        assert_eq!(
            number(cards[app]["turns_failed_total"].as_str().unwrap()),
            metric(&format!("pure_app_turns_failed_total{{app=\"{app}\"}}"))
        );
        assert!(cards[app]["class"].as_str().unwrap() == "card", "{v}");
    }
    for (outlet, kind) in [("cloud", "webhook"), ("relay", "link"), ("archive", "app")] {
        let lag = cards[format!("sensors/{outlet}")]["lag"].as_str().unwrap();
        assert_eq!(
            number(lag),
            metric(&format!(
                "pure_outlet_lag_records{{app=\"sensors\",outlet=\"{outlet}\",kind=\"{kind}\"}}"
            )),
            "{outlet}: {lag}"
        );
        assert_eq!(
            number(
                cards[format!("sensors/{outlet}")]["sent_total"]
                    .as_str()
                    .unwrap()
            ),
            metric(&format!(
                "pure_outlet_sent_total{{app=\"sensors\",outlet=\"{outlet}\"}}"
            ))
        );
    }
    assert_eq!(
        number(page["senders"].as_str().unwrap()),
        metric("pure_senders")
    );
    assert_eq!(
        number(page["active_runs"].as_str().unwrap()),
        metric("pure_sessions_active")
    );
    assert_eq!(
        number(page["x25519.total"].as_str().unwrap()),
        metric("pure_x25519_total")
    );
    let drops: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("pure_drops_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(number(page["drops.total"].as_str().unwrap()), drops);
    assert_eq!(
        number(page["drops.auth"].as_str().unwrap()),
        metric("pure_drops_total{stage=\"auth\"}")
    );

    // The outlet to the far side that is down stands out: its colour, and words saying why and what to do.
    let cloud = &cards["sensors/cloud"];
    assert!(cloud["class"].as_str().unwrap().contains("fail"), "{cloud}");
    assert_eq!(cloud["badge"], json!("✖ FAILING"), "{cloud}");
    let words = cloud["state_words"].as_str().unwrap();
    assert!(
        words.starts_with("Failing, retrying") && words.contains("Connection refused"),
        "{words}"
    );
    assert!(
        cloud["hint"]
            .as_str()
            .unwrap()
            .contains("is the far side running"),
        "{cloud}"
    );
    assert!(
        metric("pure_outlet_errors_total{app=\"sensors\",outlet=\"cloud\",kind=\"connect\"}")
            >= 1.0
    );
    assert_eq!(number(cloud["lag"].as_str().unwrap()), total as f64);
    // The link to the same closed port (UDP) fails or waits between retries: never shown as fine, always with
    // the error in words.
    let relay = &cards["sensors/relay"];
    let class = relay["class"].as_str().unwrap();
    assert!(class.contains("fail") || class.contains("warn"), "{relay}");
    assert!(
        relay["state_words"]
            .as_str()
            .unwrap()
            .contains("Connection refused"),
        "{relay}"
    );
    let healthy = &cards["sensors/archive"];
    assert!(
        !healthy["class"].as_str().unwrap().contains("fail"),
        "{healthy}"
    );
    // The node stores, so /healthz says 200; but an outlet fails, so the header is not green: DEGRADED, and the
    // box under it names the outlet and what is wrong.
    assert_eq!(node.http_get("/healthz").0, 200);
    assert_eq!(v["health"], json!("DEGRADED"), "{v}");
    assert_eq!(v["health_class"], json!("degraded"));
    assert_ne!(
        v["health_colour"],
        json!("rgb(126, 224, 143)"),
        "the OK green"
    );
    let issues = v["issues"].as_array().unwrap();
    assert!(
        issues.iter().any(|i| i[0] == "outlet_failing"
            && i[1]
                .as_str()
                .unwrap()
                .starts_with("outlet sensors/cloud failing")),
        "{issues:?}"
    );
    let status: Value = serde_json::from_str(&node.http_get("/status.json").1).unwrap();
    assert_eq!(status["health"], json!("degraded"), "{status}");
    assert_eq!(status["healthy"], json!(true));
    // The webhook's token is in its URL's query: not on the page.
    let text = v["text"].as_str().unwrap();
    assert!(!text.contains("s3cret"), "{text}");
    assert_eq!(v["marker"], json!("same document"));

    // A reload refused: the page says so, and why, with the file's line.
    write_atomic(
        &apps,
        "[apps.sensors]\nturn_records = \"many\"\n[apps.archive]\naccept = []\n",
    );
    node.signal(libc::SIGHUP);
    wait_for("the page to show the refused reload", || {
        let v = read();
        let reload = v["page"]["reload"].as_str().unwrap_or("");
        reload.starts_with("REFUSED") && reload.contains("turn_records")
    });
    let reload = read()["page"]["reload"].clone();
    assert!(
        reload.as_str().unwrap().contains("(0 applied, 1 refused)"),
        "{reload}"
    );
    assert_eq!(node.metric("pure_reloads_failed_total"), Some(1.0));
    wait_for("the refused reload among the issues", || {
        read()["issues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i[0] == "reload_refused" && i[1].as_str().unwrap().contains("turn_records"))
    });
    assert_eq!(read()["stale"], json!(false));

    let png = browser.screenshot();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    if let Some(path) = std::env::var_os("STATUS_PAGE_SCREENSHOT") {
        std::fs::write(&path, &png).unwrap();
        eprintln!(
            "status_page: screenshot written to {}",
            Path::new(&path).display()
        );
    }

    // The node stops: the page says NOT UPDATING and dims what it shows, so old figures do not pass for current.
    drop(node);
    wait_for("the page to say it is not updating", || {
        read()["page"]["connection"]
            .as_str()
            .is_some_and(|c| c.starts_with("NOT UPDATING"))
    });
    let v = read();
    assert_eq!(v["stale"], json!(true), "{v}");
    assert!(v["opacity"].as_f64().unwrap() < 0.6, "{v}");
}
