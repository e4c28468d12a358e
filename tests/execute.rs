//! `Journal::execute`'s typed results: JSON round trips and a wrong type answered as a typed
//! error. What `execute` answers for every admission, and each way its closure can end, are
//! conformance bodies run on every backend (tests/conformance.rs).

use opjournal::{ErrorKind, OpResult, Outcome};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Added {
    light: String,
}

#[test]
fn typed_results_round_trip_and_a_wrong_type_is_a_typed_error() -> opjournal::Result<()> {
    let outcome = Outcome::applied_json(
        7,
        &Added {
            light: "light-7".into(),
        },
    )?;
    assert_eq!(
        outcome.kind(),
        Outcome::applied(7, Vec::new()).kind(),
        "applied at revision 7"
    );
    let result = OpResult {
        bytes: br#"{"light":"light-7"}"#.to_vec(),
        changed_assets: Vec::new(),
    };
    assert_eq!(
        result.json::<Added>()?,
        Added {
            light: "light-7".into()
        }
    );
    let err = result.json::<Vec<u32>>().expect_err("not a list");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let err = Outcome::applied_json(7, &bad).expect_err("non-string keys are not JSON");
    assert!(
        matches!(err.kind(), ErrorKind::InvalidInput { .. }),
        "{err:?}"
    );
    Ok(())
}
