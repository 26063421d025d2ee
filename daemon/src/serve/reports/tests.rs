use super::*;

fn entry(source: u16, loss_sum: f64, tokens: u64) -> SourceLoss {
    SourceLoss {
        source,
        loss_sum,
        tokens,
    }
}

#[test]
fn bad_reports_are_refused_counted_and_never_summed() {
    let reports = Reports::new(vec!["a".into(), "b".into()], 2, Some(4));
    assert_eq!(
        reports.accept(0, 4, &[entry(2, 1.0, 1)]),
        Err(Refused::Source)
    );
    assert_eq!(
        reports.accept(0, 4, &[entry(0, f64::NAN, 1)]),
        Err(Refused::Value)
    );
    assert_eq!(
        reports.accept(0, 4, &[entry(0, -1.0, 1)]),
        Err(Refused::Value)
    );
    assert_eq!(
        reports.accept(0, 3, &[entry(0, 1.0, 1)]),
        Err(Refused::Decided)
    );
    assert_eq!(reports.accept(0, 4, &[entry(0, 6.0, 3)]), Ok(()));
    assert_eq!(
        reports.accept(0, 4, &[entry(0, 6.0, 3)]),
        Err(Refused::Duplicate)
    );
    assert_eq!(
        reports.accept(1, 4, &[entry(1, 2.0, 1), entry(0, 1.0, 1)]),
        Ok(())
    );
    let (sums, missing) = reports.wait_for(4, 5, Duration::ZERO, |_| false);
    assert!(missing.is_none());
    assert_eq!(
        sums[0],
        Observed {
            loss_sum: 7.0,
            tokens: 4
        }
    );
    assert_eq!(
        sums[1],
        Observed {
            loss_sum: 2.0,
            tokens: 1
        }
    );
    // Decided from then on.
    assert_eq!(
        reports.accept(0, 4, &[entry(0, 1.0, 1)]),
        Err(Refused::Decided)
    );
    let book = reports.lock();
    assert_eq!(book.accepted, 2);
    assert_eq!(book.refused.get(&Refused::Value), Some(&2));
    assert_eq!(book.refused.get(&Refused::Decided), Some(&2));
}

#[test]
fn a_decision_names_the_reports_it_did_not_get() {
    let reports = Reports::new(vec!["a".into()], 3, Some(0));
    reports.accept(0, 0, &[entry(0, 1.0, 1)]).unwrap();
    reports.accept(1, 1, &[entry(0, 1.0, 1)]).unwrap();
    let (sums, missing) = reports.wait_for(0, 3, Duration::from_millis(50), |_| false);
    assert_eq!(
        missing.unwrap().what,
        "step 0 from ranks [1, 2], step 1 from ranks [0, 2], step 2 from every rank"
    );
    // What did come is summed (what `on_missing = "reported"` decides from).
    let got = Observed {
        loss_sum: 2.0,
        tokens: 2,
    };
    assert_eq!(sums, vec![got]);
}

#[test]
fn a_waiting_decision_gets_the_report_that_arrives() {
    let reports = std::sync::Arc::new(Reports::new(vec!["a".into()], 1, Some(0)));
    let late = std::sync::Arc::clone(&reports);
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        late.accept(0, 0, &[entry(0, 3.0, 2)]).unwrap();
    });
    let (sums, missing) = reports.wait_for(0, 1, Duration::from_secs(30), |_| false);
    assert!(missing.is_none());
    assert_eq!(sums[0].tokens, 2);
    sender.join().unwrap();
}

#[test]
fn steps_below_where_the_trainers_resumed_are_not_waited_for() {
    let reports = Reports::new(vec!["a".into()], 1, Some(0));
    reports.accept(0, 5, &[entry(0, 1.0, 1)]).unwrap();
    let started = Instant::now();
    let (_, missing) = reports.wait_for(2, 6, Duration::from_secs(30), |s| s < 5);
    assert!(started.elapsed() < Duration::from_secs(5), "not waited for");
    assert_eq!(
        missing.unwrap().what,
        "step 2 from every rank, step 3 from every rank, step 4 from every rank"
    );
}
