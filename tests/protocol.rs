//! The example session in `docs/protocol.md` is what the editor service answers: the
//! test plays the documented requests over a real socket against the service that
//! `opjournal demo`, `opjournal serve` and `examples/editor.rs` run, and compares every
//! documented reply.
#![cfg(feature = "service")]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use opjournal::Journal;
use opjournal::service::{Edit, JournalOpener, Service, ServiceConfig};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const DOC: &str = include_str!("../docs/protocol.md");

/// Reply fields whose values depend on the clock or wording, not on the protocol.
const VOLATILE: [&str; 4] = ["ack_deadline", "since", "completed_at", "message"];

struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

fn connect(addr: std::net::SocketAddr) -> std::io::Result<Conn> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let reader = BufReader::new(stream.try_clone()?);
    Ok(Conn { stream, reader })
}

/// The documented session: the lines of the code block after `## A session`.
fn documented_session() -> Vec<&'static str> {
    let after = DOC.split("## A session").nth(1).unwrap_or_default();
    let block = after.split("```").nth(1).unwrap_or_default();
    block.lines().skip(1).collect()
}

fn assert_reply_matches(expected: &Value, got: &Value) {
    let (Some(expected), Some(got_obj)) = (expected.as_object(), got.as_object()) else {
        panic!("not objects: expected {expected}, got {got}");
    };
    for (key, value) in expected {
        assert!(got_obj.contains_key(key), "`{key}` missing from {got}");
        if VOLATILE.contains(&key.as_str()) {
            continue;
        }
        // Deliveries and acknowledgements join `history` once committed (lazily, within
        // 200 ms of further ones): the documented events come first, in order.
        if key == "history" {
            let (Some(doc), Some(sent)) = (value.as_array(), got_obj[key].as_array()) else {
                panic!("`history` is not a list in {got}");
            };
            assert!(sent.starts_with(doc), "`history` differs in {got}");
            continue;
        }
        assert_eq!(&got_obj[key], value, "`{key}` differs in {got}");
    }
    for key in got_obj.keys() {
        assert!(
            expected.contains_key(key),
            "`{key}` is sent but not documented: {got}"
        );
    }
}

#[test]
fn documented_session_is_what_the_editor_service_answers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("editor.opj");
    let open: JournalOpener = Box::new(move || Journal::open(&journal));
    let mut cfg = ServiceConfig::new(dir.path().join("editor.scene.json"));
    cfg.notes = Box::new(|note| eprintln!("editor: {note}"));
    let service = Service::start(TcpListener::bind(("127.0.0.1", 0))?, open, cfg)?;
    let session = documented_session();
    assert!(session.len() > 10, "no session found in docs/protocol.md");
    let mut conn = connect(service.addr())?;
    let (mut sent, mut checked) = (0, 0);
    for line in session {
        let line = line.trim();
        if let Some(request) = line.strip_prefix("-> ") {
            conn.stream.write_all(request.as_bytes())?;
            conn.stream.write_all(b"\n")?;
            sent += 1;
        } else if let Some(reply) = line.strip_prefix("<- ") {
            let expected: Value = serde_json::from_str(reply)?;
            let mut got = String::new();
            conn.reader.read_line(&mut got)?;
            let got: Value = serde_json::from_str(&got)?;
            assert_reply_matches(&expected, &got);
            checked += 1;
        } else if line.starts_with("(the connection drops") {
            conn.stream.shutdown(std::net::Shutdown::Both)?;
            service.wait_disconnected("tab-1", Duration::from_secs(10))?;
            conn = connect(service.addr())?;
        }
    }
    assert_eq!((sent, checked), (7, 9), "the documented session changed");
    let doc = service.document();
    assert_eq!(
        doc.effects(
            "op_7f3",
            &Edit::Add {
                object: "light".into(),
                beside: "door".into()
            }
        ),
        1,
        "the light was added once: {doc:?}"
    );
    service.shutdown()?;
    Ok(())
}
