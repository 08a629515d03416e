//! Runs `examples/guarded_tool.rs`: a user's own guarded tool replays instead of repeating.

#[allow(dead_code)]
#[path = "../examples/guarded_tool.rs"]
mod example;

#[tokio::test]
async fn the_example_creates_one_note_and_replays_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let summary = example::run(dir.path()).await.unwrap();
    assert_eq!(summary["notes"], 1, "{summary}");
    assert_eq!(summary["first"]["replayed"], false);
    assert_eq!(summary["first"]["operationId"], "note-1");
    assert_eq!(summary["first"]["result"], "note 1");
    assert_eq!(summary["retry"]["replayed"], true);
    assert_eq!(summary["retry"]["effectId"], summary["first"]["effectId"]);
    assert_eq!(summary["status_state"], "applied");
}
