//! The writer's batches, and what a replica taking a session over learns from Redis: which
//! streams still owe responses, and what a replica that left the session kept there.

use super::*;

#[test]
fn only_the_last_trim_of_a_stream_in_a_batch_is_sent() {
    let s = sid("s");
    let trim = |stream, through| Op::Trim {
        session: s.clone(),
        stream,
        through,
    };
    let append = |stream, seq| Op::Append {
        session: s.clone(),
        stream,
        seq,
        data: Bytes::new(),
    };
    let batch = vec![
        append(0, 1),
        trim(0, 1),
        append(0, 2),
        trim(1, 5),
        trim(0, 2),
        Op::Release {
            session: s.clone(),
            stream: 1,
        },
        trim(1, 6),
    ];
    assert_eq!(
        superseded_trims(&batch),
        vec![false, true, false, false, false, false, false]
    );
}

#[test]
fn a_debt_settled_within_a_batch_is_not_sent() {
    let s = sid("s");
    let other = sid("t");
    let owe = |session: &Arc<str>, stream| Op::Owe {
        session: session.clone(),
        stream,
        ids: Bytes::from_static(b"[1]"),
    };
    let answered = |session: &Arc<str>, stream| Op::Answered {
        session: session.clone(),
        stream,
    };
    let batch = vec![
        owe(&s, 1),
        owe(&s, 2),
        answered(&s, 1),
        owe(&s, 3),
        Op::Release {
            session: s.clone(),
            stream: 3,
        },
        owe(&other, 1),
        answered(&s, 4),
        owe(&s, 5),
        Op::ReleaseSession {
            session: s.clone(),
            streams: vec![],
        },
    ];
    assert_eq!(
        settled_in_batch(&batch),
        vec![true, true, true, true, false, false, false, true, false],
        "the other session's still owes; an answer with no debt in the batch is sent"
    );
    // Without the session's release, stream 2 still owes.
    assert!(!settled_in_batch(&batch[..8])[1]);
}

#[tokio::test]
async fn an_adopting_replica_learns_which_streams_still_owe_responses() {
    let prefix = Prefix::new();
    let a = store(&prefix).await;
    let id = sid("owing");
    let ea = a.session(&id);
    ea.owes(1, Bytes::from_static(b"[1]"));
    ea.owes(2, Bytes::from_static(br#"["a","b"]"#));
    ea.owes(3, Bytes::from_static(b"[3]"));
    ea.append(2, 1, data(2, 1));
    ea.answered(1);
    ea.release(3);
    assert!(a.flush(FLUSH).await);

    let b = store(&prefix).await;
    let adopted = b.adopt(&id).await.expect("adopted");
    assert_eq!(
        adopted.in_flight,
        vec![(2, Bytes::from_static(br#"["a","b"]"#))],
        "answered and released streams owe nothing"
    );
    // Gone with the session.
    b.release_session(&id);
    assert!(b.flush(FLUSH).await);
    assert_eq!(prefix.keys(), Vec::<String>::new());

    // What Redis hands back is checked.
    let key = prefix.key(&format!("in-flight:{}", named("bad")));
    let mut con = sync_conn();
    let _: () = ::redis::cmd("HSET")
        .arg(&key)
        .arg("x")
        .arg("[1]")
        .query(&mut con)
        .unwrap();
    let got = b.adopt(&sid("bad")).await;
    assert!(matches!(got, Err(ReplayError::Backend(_))), "{got:?}");
}

#[tokio::test]
async fn leaving_a_session_keeps_its_keys_for_the_next_replica() {
    let prefix = Prefix::new();
    let a = store(&prefix).await;
    let id = sid("left");
    let ea = a.session(&id);
    ea.append(0, 1, data(0, 1));
    a.leave_session(&id);
    ea.append(0, 2, data(0, 2));
    assert!(a.flush(FLUSH).await);
    assert_eq!(a.usage(), (0, 0), "nothing kept here");
    let b = store(&prefix).await;
    let eb = b.session(&id);
    assert_eq!(
        eb.replay(0, 0, 10, false).await,
        Ok(events(0, 1..=1)),
        "what was written before leaving is there; nothing after"
    );
}
