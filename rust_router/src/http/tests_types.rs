//! Parsing of the wire types: input shapes and their errors.

use super::types::*;
use crate::infer::InferInput;
use crate::tokenization::TruncationDirection;
use serde_json::{json, Value};

fn input(v: Value) -> Result<Input, String> {
    Input::try_from(v)
}

#[test]
fn input_shapes() {
    use InputType::*;
    assert_eq!(input(json!("a")), Ok(Input::Single(String("a".into()))));
    assert_eq!(input(json!([1, 2])), Ok(Input::Single(Ids(vec![1, 2]))));
    assert_eq!(input(json!([1.0, 2])), Ok(Input::Single(Ids(vec![1, 2]))));
    assert!(input(json!([1.5])).is_err());
    assert_eq!(
        input(json!(["a", [3]])),
        Ok(Input::Batch(vec![String("a".into()), Ids(vec![3])]))
    );
    assert_eq!(input(json!([])), Ok(Input::Batch(vec![])));
    assert!(input(json!(7)).is_err());
    assert!(input(json!([-1])).is_err());
    assert!(input(json!([["a"]])).is_err());
    assert!(input(json!({"text": 1}))
        .unwrap_err()
        .contains("list of strings"));
}

#[test]
fn predict_shapes() {
    use Sequence::*;
    let p = |v| PredictInput::try_from(v);
    assert_eq!(p(json!("a")), Ok(PredictInput::Single(Single("a".into()))));
    assert_eq!(
        p(json!(["a", "b"])),
        Ok(PredictInput::Single(Pair("a".into(), "b".into())))
    );
    assert_eq!(
        p(json!([["a"], ["b", "c"]])),
        Ok(PredictInput::Batch(vec![
            Single("a".into()),
            Pair("b".into(), "c".into())
        ]))
    );
    assert!(p(json!(["a", "b", "c"])).is_err());
    assert!(p(json!([["a", "b", "c"]])).is_err());
    assert!(p(json!([1])).is_err());
}

#[test]
fn token_id_shapes() {
    let ids = |v| InputIds::try_from(v);
    assert_eq!(ids(json!([1, 2])), Ok(InputIds::Single(vec![1, 2])));
    assert_eq!(
        ids(json!([[1], [2, 3]])),
        Ok(InputIds::Batch(vec![vec![1], vec![2, 3]]))
    );
    let too_big = ids(json!([4294967296u64])).unwrap_err();
    assert!(too_big.contains("from 0 to 4294967295"), "{too_big}");
    assert!(ids(json!([-1])).is_err());
    assert!(ids(json!("a")).unwrap_err().contains("list of token ids"));
    assert!(ids(json!([[1], 2])).is_err());
}

#[test]
fn truncation_direction_accepts_both_cases() {
    for s in ["\"Left\"", "\"left\""] {
        let d: TruncationDirection = serde_json::from_str(s).unwrap();
        assert_eq!(d, TruncationDirection::Left);
    }
}

#[test]
fn inputs_count_characters_as_their_encodings_do() {
    for input in [
        InputType::String("héllo wörld 日本".into()),
        InputType::String(String::new()),
        InputType::Ids(vec![5, 6, 7]),
    ] {
        let InferInput::Text(text) = InferInput::from(input.clone()) else {
            panic!("{input:?} is a text");
        };
        let expected = text.count_chars();
        assert_eq!(input.count_chars(), expected, "{input:?}");
    }
    assert_eq!(InputType::String("héllo".into()).count_chars(), 5);
}

#[test]
fn inputs_may_be_text_and_image_objects_mixed_with_strings() {
    assert_eq!(
        input(json!({"image": "aGk="})).unwrap(),
        Input::Single(InputType::Image("aGk=".into()))
    );
    assert_eq!(
        input(json!({"text": "hi"})).unwrap(),
        Input::Single(InputType::String("hi".into()))
    );
    assert_eq!(
        input(json!(["a", {"image": "data:image/png;base64,aGk="}, {"text": "b"}])).unwrap(),
        Input::Batch(vec![
            InputType::String("a".into()),
            InputType::Image("data:image/png;base64,aGk=".into()),
            InputType::String("b".into()),
        ])
    );
    assert_eq!(InputType::Image("aGk=".into()).count_chars(), 0);
    assert!(InputType::Image(String::new()).is_empty());
    assert_eq!(
        InferInput::from(InputType::Image("aGk=".into())),
        InferInput::Image("aGk=".into())
    );
}

#[test]
fn input_objects_need_exactly_one_known_string_key() {
    for (body, says) in [
        (json!({"audio": "x"}), "unknown input key `audio`"),
        (json!([{"url": "x"}]), "unknown input key `url`"),
        (json!({}), "exactly one key"),
        (json!({"text": "a", "image": "b"}), "exactly one key"),
        (json!([{"image": 7}]), "`image` must be a string"),
        (json!({"text": ["a"]}), "`text` must be a string"),
    ] {
        let err = input(body.clone()).unwrap_err();
        assert!(err.contains(says), "{body}: {err}");
    }
}
