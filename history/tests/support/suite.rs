//! The contract every history backend keeps, written once against
//! `&dyn HistoryStore`. `tests/contract.rs` runs each case on every backend
//! (memory, sqlite, postgres), so the gateway behaves the same whichever one
//! `--history-backend` picks.
//!
//! Each case starts from an empty store and uses ids of its own.

use serde_json::{Value, json};
use smg_history::{
    Conversation, ConversationItem, HistoryError, HistoryStore, Order, PageRequest, StoredResponse,
};

/// The names of every case, for the runner's macro (kept in one place so a
/// new case cannot be forgotten on one backend).
#[macro_export]
macro_rules! for_each_case {
    ($m:ident!($($args:tt)*)) => {
        $m!($($args)*;
            save_get_upsert_and_delete_a_response,
            json_round_trips_unchanged,
            a_chain_of_three_is_returned_oldest_first,
            a_chain_of_ten_is_bounded_by_max_steps,
            an_unknown_id_has_an_empty_chain,
            a_deleted_middle_link_stops_the_chain_at_a_dangling_id,
            conversations_are_created_read_updated_and_deleted,
            deleting_a_conversation_deletes_its_items,
            a_duplicate_conversation_id_is_a_conflict,
            items_keep_the_order_they_were_added_in,
            list_items_pages_ascending_on_exact_boundaries,
            list_items_pages_descending_on_exact_boundaries,
            an_after_cursor_outside_the_conversation_is_not_found,
            an_unknown_conversation_lists_no_items,
            items_are_reached_only_through_their_conversation,
            save_response_appends_its_items_to_the_conversation,
            save_response_to_a_missing_conversation_saves_nothing,
            a_duplicate_item_id_is_a_conflict_and_adds_nothing,
            orphans_are_responses_of_gone_gateways_never_of_live_ones,
            json_keeps_the_order_of_its_keys,
            a_cancel_is_recorded_only_on_a_response_in_flight_for_its_owner,
        );
    };
}

pub fn response(id: &str, previous: Option<&str>) -> StoredResponse {
    StoredResponse {
        id: id.into(),
        previous_response_id: previous.map(Into::into),
        conversation_id: None,
        model: "test-model".into(),
        status: "completed".into(),
        created_at: 1_700_000_000,
        input: json!([{"id": format!("msg_in_{id}"), "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": format!("question {id}")}]}]),
        output: json!([{"id": format!("msg_out_{id}"), "type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": format!("answer {id}")}]}]),
        raw: json!({"id": id, "object": "response", "status": "completed"}),
        owner: None,
    }
}

pub fn conversation(id: &str) -> Conversation {
    Conversation {
        id: id.into(),
        created_at: 1_700_000_000,
        metadata: json!({"topic": "tests"}),
    }
}

pub fn item(id: &str, conversation_id: &str) -> ConversationItem {
    ConversationItem {
        id: id.into(),
        conversation_id: conversation_id.into(),
        created_at: 1_700_000_001,
        item: json!({"id": id, "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": id}]}),
    }
}

fn page(limit: usize, order: Order, after: Option<&str>) -> PageRequest {
    PageRequest {
        limit,
        order,
        after: after.map(Into::into),
    }
}

fn ids<T>(items: &[T], id: impl Fn(&T) -> &str) -> Vec<String> {
    items.iter().map(|x| id(x).to_owned()).collect()
}

fn item_ids(items: &[ConversationItem]) -> Vec<String> {
    ids(items, |i| &i.id)
}

fn chain_ids(chain: &[StoredResponse]) -> Vec<String> {
    ids(chain, |r| &r.id)
}

/// Saves the chain `{prefix}_1 <- {prefix}_2 <- … <- {prefix}_n`.
async fn save_chain(store: &dyn HistoryStore, prefix: &str, n: usize) -> Vec<String> {
    let names: Vec<String> = (1..=n).map(|i| format!("{prefix}_{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| names[p].as_str());
        store
            .save_response(&response(name, previous), &[])
            .await
            .unwrap();
    }
    names
}

/// Makes conversation `id` with items `{id}_1 ..= {id}_n`.
async fn conversation_with_items(store: &dyn HistoryStore, id: &str, n: usize) -> Vec<String> {
    let items: Vec<ConversationItem> = (1..=n).map(|i| item(&format!("{id}_{i}"), id)).collect();
    store
        .create_conversation(&conversation(id), &items)
        .await
        .unwrap();
    item_ids(&items)
}

pub async fn save_get_upsert_and_delete_a_response(store: &dyn HistoryStore) {
    let mut stored = response("resp_a", None);
    stored.conversation_id = Some("conv_elsewhere".into());
    stored.status = "in_progress".into();
    store.save_response(&stored, &[]).await.unwrap();
    assert_eq!(
        store.get_response("resp_a").await.unwrap(),
        Some(stored.clone())
    );

    // A background response is stored in progress, then finished.
    stored.status = "completed".into();
    stored.output = json!([{"id": "msg_late", "type": "message"}]);
    stored.raw = json!({"id": "resp_a", "status": "completed"});
    store.save_response(&stored, &[]).await.unwrap();
    assert_eq!(store.get_response("resp_a").await.unwrap(), Some(stored));

    assert!(store.delete_response("resp_a").await.unwrap());
    assert_eq!(store.get_response("resp_a").await.unwrap(), None);
    assert!(!store.delete_response("resp_a").await.unwrap());
    assert_eq!(store.get_response("resp_never").await.unwrap(), None);
}

pub async fn json_round_trips_unchanged(store: &dyn HistoryStore) {
    let tricky: Value = json!({
        "text": "quotes \" backslash \\ newline \n tab \t unicode é 漢字 🦀 '; DROP TABLE responses; --",
        "numbers": [0, -1, 9_007_199_254_740_993_i64, 1.5, -0.25, 1e-7],
        "nested": {"empty_object": {}, "empty_array": [], "null": null, "flags": [true, false]},
    });
    let mut stored = response("resp_json", None);
    stored.input = json!([tricky.clone()]);
    stored.output = json!([]);
    stored.raw = tricky.clone();
    store.save_response(&stored, &[]).await.unwrap();
    assert_eq!(store.get_response("resp_json").await.unwrap(), Some(stored));

    let mut conv = conversation("conv_json");
    conv.metadata = json!({"k": "é 🦀", "n": "1"});
    let mut first = item("item_json", "conv_json");
    first.item = tricky;
    store
        .create_conversation(&conv, std::slice::from_ref(&first))
        .await
        .unwrap();
    assert_eq!(
        store.get_conversation("conv_json").await.unwrap(),
        Some(conv)
    );
    assert_eq!(
        store.get_item("conv_json", "item_json").await.unwrap(),
        Some(first)
    );
}

/// Objects read back with their keys in the order they were written
/// (values compare equal whatever the order, so the text is compared):
/// a function call's arguments, an item, a response, metadata.
pub async fn json_keeps_the_order_of_its_keys(store: &dyn HistoryStore) {
    let text = r#"{"zeta":1,"id":"fc_1","type":"function_call","arguments":"{\"b\":1,\"a\":2}","a":{"yy":true,"x":null}}"#;
    let value: Value = serde_json::from_str(text).unwrap();
    let mut stored = response("resp_order", None);
    stored.input = Value::Array(vec![value.clone()]);
    stored.output = Value::Array(vec![value.clone()]);
    stored.raw = value.clone();
    store.save_response(&stored, &[]).await.unwrap();
    let got = store.get_response("resp_order").await.unwrap().unwrap();
    assert_eq!(got.raw.to_string(), text);
    assert_eq!(got.input.to_string(), format!("[{text}]"));
    assert_eq!(got.output.to_string(), format!("[{text}]"));

    let mut conv = conversation("conv_order");
    conv.metadata = value.clone();
    let mut first = item("item_order", "conv_order");
    first.item = value;
    store
        .create_conversation(&conv, std::slice::from_ref(&first))
        .await
        .unwrap();
    let got = store.get_conversation("conv_order").await.unwrap().unwrap();
    assert_eq!(got.metadata.to_string(), text);
    let got = store
        .get_item("conv_order", "item_order")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.item.to_string(), text);
}

pub async fn a_chain_of_three_is_returned_oldest_first(store: &dyn HistoryStore) {
    let names = save_chain(store, "three", 3).await;
    let chain = store.response_chain("three_3", 10).await.unwrap();
    assert_eq!(chain_ids(&chain), names);
    assert_eq!(chain[0].previous_response_id, None);
    assert_eq!(chain[2], response("three_3", Some("three_2")));
    // A chain may end anywhere: from the middle, only the older part.
    let chain = store.response_chain("three_2", 10).await.unwrap();
    assert_eq!(chain_ids(&chain), names[..2]);
}

pub async fn a_chain_of_ten_is_bounded_by_max_steps(store: &dyn HistoryStore) {
    let names = save_chain(store, "ten", 10).await;
    assert_eq!(
        chain_ids(&store.response_chain("ten_10", 10).await.unwrap()),
        names
    );
    assert_eq!(
        chain_ids(&store.response_chain("ten_10", 100).await.unwrap()),
        names
    );
    // The newest `max_steps`, still oldest first.
    let chain = store.response_chain("ten_10", 4).await.unwrap();
    assert_eq!(chain_ids(&chain), names[6..]);
    assert_eq!(chain[0].previous_response_id.as_deref(), Some("ten_6"));
    assert_eq!(
        chain_ids(&store.response_chain("ten_10", 1).await.unwrap()),
        ["ten_10"]
    );
    assert!(store.response_chain("ten_10", 0).await.unwrap().is_empty());
}

pub async fn an_unknown_id_has_an_empty_chain(store: &dyn HistoryStore) {
    save_chain(store, "known", 2).await;
    assert!(
        store
            .response_chain("unknown", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn a_deleted_middle_link_stops_the_chain_at_a_dangling_id(store: &dyn HistoryStore) {
    save_chain(store, "gap", 3).await;
    assert!(store.delete_response("gap_2").await.unwrap());
    let chain = store.response_chain("gap_3", 10).await.unwrap();
    assert_eq!(chain_ids(&chain), ["gap_3"]);
    assert_eq!(chain[0].previous_response_id.as_deref(), Some("gap_2"));
    // The older part is still there on its own.
    assert_eq!(
        chain_ids(&store.response_chain("gap_1", 10).await.unwrap()),
        ["gap_1"]
    );
}

pub async fn conversations_are_created_read_updated_and_deleted(store: &dyn HistoryStore) {
    let conv = conversation("conv_crud");
    store.create_conversation(&conv, &[]).await.unwrap();
    assert_eq!(
        store.get_conversation("conv_crud").await.unwrap(),
        Some(conv.clone())
    );

    let metadata = json!({"topic": "renamed", "owner": "me"});
    let updated = store
        .update_conversation("conv_crud", &metadata)
        .await
        .unwrap();
    let expected = Conversation {
        metadata,
        ..conv.clone()
    };
    assert_eq!(updated, Some(expected.clone()));
    assert_eq!(
        store.get_conversation("conv_crud").await.unwrap(),
        Some(expected)
    );
    assert_eq!(
        store
            .update_conversation("conv_missing", &json!({}))
            .await
            .unwrap(),
        None
    );

    assert!(store.delete_conversation("conv_crud").await.unwrap());
    assert_eq!(store.get_conversation("conv_crud").await.unwrap(), None);
    assert!(!store.delete_conversation("conv_crud").await.unwrap());
}

pub async fn deleting_a_conversation_deletes_its_items(store: &dyn HistoryStore) {
    let ids = conversation_with_items(store, "conv_cascade", 3).await;
    conversation_with_items(store, "conv_kept", 1).await;
    assert!(store.delete_conversation("conv_cascade").await.unwrap());
    assert_eq!(store.get_item("conv_cascade", &ids[0]).await.unwrap(), None);
    let listed = store
        .list_items("conv_cascade", &page(10, Order::Asc, None))
        .await
        .unwrap();
    assert!(listed.items.is_empty());
    // The items are really gone: their ids are free again.
    store
        .create_conversation(
            &conversation("conv_cascade"),
            &[item(&ids[0], "conv_cascade")],
        )
        .await
        .unwrap();
    assert_eq!(
        item_ids(
            &store
                .list_items("conv_cascade", &page(10, Order::Asc, None))
                .await
                .unwrap()
                .items
        ),
        ids[..1]
    );
    // Another conversation's items are untouched.
    assert!(
        store
            .get_item("conv_kept", "conv_kept_1")
            .await
            .unwrap()
            .is_some()
    );
}

pub async fn a_duplicate_conversation_id_is_a_conflict(store: &dyn HistoryStore) {
    store
        .create_conversation(&conversation("conv_dup"), &[])
        .await
        .unwrap();
    let mut again = conversation("conv_dup");
    again.metadata = json!({"topic": "second"});
    let err = store
        .create_conversation(&again, &[item("item_dup", "conv_dup")])
        .await
        .unwrap_err();
    assert!(matches!(err, HistoryError::Conflict(_)), "{err:?}");
    assert_eq!(
        store.get_conversation("conv_dup").await.unwrap(),
        Some(conversation("conv_dup"))
    );
    assert_eq!(store.get_item("conv_dup", "item_dup").await.unwrap(), None);
}

pub async fn items_keep_the_order_they_were_added_in(store: &dyn HistoryStore) {
    // Ids that sort differently from the order they were added in.
    let first = [
        item("z_first", "conv_order"),
        item("a_second", "conv_order"),
    ];
    store
        .create_conversation(&conversation("conv_order"), &first)
        .await
        .unwrap();
    let more = [
        item("m_third", "conv_order"),
        item("b_fourth", "conv_order"),
        item("y_fifth", "conv_order"),
    ];
    store.add_items("conv_order", &more).await.unwrap();
    store
        .add_items("conv_order", &[item("c_sixth", "conv_order")])
        .await
        .unwrap();
    let listed = store
        .list_items("conv_order", &page(100, Order::Asc, None))
        .await
        .unwrap();
    assert_eq!(
        item_ids(&listed.items),
        [
            "z_first", "a_second", "m_third", "b_fourth", "y_fifth", "c_sixth"
        ]
    );
    assert!(!listed.has_more);
    assert_eq!(listed.items[2], more[0]);

    let err = store
        .add_items("conv_missing", &[item("orphan", "conv_missing")])
        .await
        .unwrap_err();
    assert!(matches!(err, HistoryError::NotFound(_)), "{err:?}");
}

/// Walks every page of `limit` and returns (ids, has_more) per page.
async fn walk(
    store: &dyn HistoryStore,
    conversation_id: &str,
    limit: usize,
    order: Order,
) -> Vec<(Vec<String>, bool)> {
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let got = store
            .list_items(conversation_id, &page(limit, order, after.as_deref()))
            .await
            .unwrap();
        after = got.items.last().map(|i| i.id.clone());
        let done = !got.has_more;
        pages.push((item_ids(&got.items), got.has_more));
        if done {
            return pages;
        }
        assert!(pages.len() <= 10, "paging does not end: {pages:?}");
    }
}

fn strs(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

pub async fn list_items_pages_ascending_on_exact_boundaries(store: &dyn HistoryStore) {
    conversation_with_items(store, "asc", 4).await;
    // 4 items in pages of 2: the second page is the last, exactly full.
    assert_eq!(
        walk(store, "asc", 2, Order::Asc).await,
        [
            (strs(&["asc_1", "asc_2"]), true),
            (strs(&["asc_3", "asc_4"]), false)
        ]
    );
    assert_eq!(
        walk(store, "asc", 3, Order::Asc).await,
        [
            (strs(&["asc_1", "asc_2", "asc_3"]), true),
            (strs(&["asc_4"]), false)
        ]
    );
    assert_eq!(
        walk(store, "asc", 4, Order::Asc).await,
        [(strs(&["asc_1", "asc_2", "asc_3", "asc_4"]), false)]
    );
    // After the last item: an empty page, nothing more.
    let last = store
        .list_items("asc", &page(2, Order::Asc, Some("asc_4")))
        .await
        .unwrap();
    assert!(last.items.is_empty() && !last.has_more, "{last:?}");
}

pub async fn list_items_pages_descending_on_exact_boundaries(store: &dyn HistoryStore) {
    conversation_with_items(store, "desc", 5).await;
    assert_eq!(
        walk(store, "desc", 2, Order::Desc).await,
        [
            (strs(&["desc_5", "desc_4"]), true),
            (strs(&["desc_3", "desc_2"]), true),
            (strs(&["desc_1"]), false)
        ]
    );
    assert_eq!(
        walk(store, "desc", 5, Order::Desc).await,
        [(
            strs(&["desc_5", "desc_4", "desc_3", "desc_2", "desc_1"]),
            false
        )]
    );
    let from_middle = store
        .list_items("desc", &page(10, Order::Desc, Some("desc_3")))
        .await
        .unwrap();
    assert_eq!(item_ids(&from_middle.items), ["desc_2", "desc_1"]);
    assert!(!from_middle.has_more);
    let first = store
        .list_items("desc", &page(1, Order::Desc, Some("desc_1")))
        .await
        .unwrap();
    assert!(first.items.is_empty() && !first.has_more, "{first:?}");
}

pub async fn an_after_cursor_outside_the_conversation_is_not_found(store: &dyn HistoryStore) {
    conversation_with_items(store, "cursor_a", 2).await;
    conversation_with_items(store, "cursor_b", 2).await;
    for after in ["cursor_b_1", "no_such_item"] {
        for order in [Order::Asc, Order::Desc] {
            let err = store
                .list_items("cursor_a", &page(10, order, Some(after)))
                .await
                .unwrap_err();
            assert!(matches!(err, HistoryError::NotFound(_)), "{after}: {err:?}");
        }
    }
}

pub async fn an_unknown_conversation_lists_no_items(store: &dyn HistoryStore) {
    let listed = store
        .list_items("conv_nowhere", &page(10, Order::Asc, None))
        .await
        .unwrap();
    assert!(listed.items.is_empty() && !listed.has_more);
}

pub async fn items_are_reached_only_through_their_conversation(store: &dyn HistoryStore) {
    conversation_with_items(store, "scope_a", 2).await;
    conversation_with_items(store, "scope_b", 1).await;
    assert_eq!(
        store.get_item("scope_a", "scope_a_1").await.unwrap(),
        Some(item("scope_a_1", "scope_a"))
    );
    assert_eq!(store.get_item("scope_b", "scope_a_1").await.unwrap(), None);
    assert_eq!(
        store.get_item("scope_nowhere", "scope_a_1").await.unwrap(),
        None
    );
    assert!(!store.delete_item("scope_b", "scope_a_1").await.unwrap());
    assert!(
        store
            .get_item("scope_a", "scope_a_1")
            .await
            .unwrap()
            .is_some()
    );

    assert!(store.delete_item("scope_a", "scope_a_1").await.unwrap());
    assert_eq!(store.get_item("scope_a", "scope_a_1").await.unwrap(), None);
    assert!(!store.delete_item("scope_a", "scope_a_1").await.unwrap());
    let listed = store
        .list_items("scope_a", &page(10, Order::Asc, None))
        .await
        .unwrap();
    assert_eq!(item_ids(&listed.items), ["scope_a_2"]);
}

pub async fn save_response_appends_its_items_to_the_conversation(store: &dyn HistoryStore) {
    conversation_with_items(store, "conv_turns", 1).await;
    let mut first = response("turn_1", None);
    first.conversation_id = Some("conv_turns".into());
    let turn_1 = [
        item("turn_1_in", "conv_turns"),
        item("turn_1_out", "conv_turns"),
    ];
    store.save_response(&first, &turn_1).await.unwrap();
    let mut second = response("turn_2", Some("turn_1"));
    second.conversation_id = Some("conv_turns".into());
    store
        .save_response(&second, &[item("turn_2_out", "conv_turns")])
        .await
        .unwrap();
    let listed = store
        .list_items("conv_turns", &page(10, Order::Asc, None))
        .await
        .unwrap();
    assert_eq!(
        item_ids(&listed.items),
        ["conv_turns_1", "turn_1_in", "turn_1_out", "turn_2_out"]
    );
    assert_eq!(store.get_response("turn_2").await.unwrap(), Some(second));
}

pub async fn save_response_to_a_missing_conversation_saves_nothing(store: &dyn HistoryStore) {
    conversation_with_items(store, "conv_present", 1).await;
    let mut orphan = response("resp_orphan", None);
    orphan.conversation_id = Some("conv_absent".into());
    let err = store
        .save_response(&orphan, &[item("orphan_item", "conv_absent")])
        .await
        .unwrap_err();
    assert!(matches!(err, HistoryError::NotFound(_)), "{err:?}");
    assert_eq!(store.get_response("resp_orphan").await.unwrap(), None);

    // One good item before the bad one: that one is not kept either.
    let err = store
        .save_response(
            &orphan,
            &[
                item("good_item", "conv_present"),
                item("orphan_item", "conv_absent"),
            ],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, HistoryError::NotFound(_)), "{err:?}");
    assert_eq!(store.get_response("resp_orphan").await.unwrap(), None);
    assert_eq!(
        store.get_item("conv_present", "good_item").await.unwrap(),
        None
    );

    // An upsert that fails keeps the old version.
    let mut kept = response("resp_kept", None);
    kept.status = "in_progress".into();
    store.save_response(&kept, &[]).await.unwrap();
    let mut finished = kept.clone();
    finished.status = "completed".into();
    let err = store
        .save_response(&finished, &[item("late_item", "conv_absent")])
        .await
        .unwrap_err();
    assert!(matches!(err, HistoryError::NotFound(_)), "{err:?}");
    assert_eq!(store.get_response("resp_kept").await.unwrap(), Some(kept));
}

pub async fn a_duplicate_item_id_is_a_conflict_and_adds_nothing(store: &dyn HistoryStore) {
    conversation_with_items(store, "conv_items", 1).await;
    conversation_with_items(store, "conv_other", 1).await;
    for taken in ["conv_items_1", "conv_other_1"] {
        let err = store
            .add_items(
                "conv_items",
                &[item("fresh_item", "conv_items"), item(taken, "conv_items")],
            )
            .await
            .unwrap_err();
        assert!(matches!(err, HistoryError::Conflict(_)), "{taken}: {err:?}");
    }
    let err = store
        .save_response(
            &response("resp_dup_item", None),
            &[
                item("fresh_item", "conv_items"),
                item("conv_items_1", "conv_items"),
            ],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, HistoryError::Conflict(_)), "{err:?}");
    assert_eq!(store.get_response("resp_dup_item").await.unwrap(), None);
    let listed = store
        .list_items("conv_items", &page(10, Order::Asc, None))
        .await
        .unwrap();
    assert_eq!(item_ids(&listed.items), ["conv_items_1"]);
}

/// Writes a chain of 3 and a conversation of 3 items, for a second store to
/// read with [`read_the_sample`].
/// `id` in flight (`status`), run by `owner`.
fn running(id: &str, status: &str, owner: Option<&str>) -> StoredResponse {
    StoredResponse {
        status: status.into(),
        output: json!([]),
        raw: json!({"id": id, "object": "response", "status": status}),
        owner: owner.map(Into::into),
        ..response(id, None)
    }
}

/// The ids of `responses`, sorted.
fn sorted_ids(responses: &[StoredResponse]) -> Vec<&str> {
    let mut ids: Vec<&str> = responses.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

/// Two live gateways `a` and `b` share the store. At `b`'s start it may
/// claim its own previous life's rows (`mine`), rows nobody owns and rows
/// of an owner that never beat; never `a`'s while `a`'s lease is fresh.
/// Once `a`'s lease has run out (a zero lease here), its rows are orphans
/// too. Ending one replaces it only while it is still in flight under the
/// owner it was found with.
pub async fn orphans_are_responses_of_gone_gateways_never_of_live_ones(store: &dyn HistoryStore) {
    let hour = std::time::Duration::from_secs(3600);
    store.heartbeat("a").await.unwrap();
    store.heartbeat("b").await.unwrap();
    store.heartbeat("b").await.unwrap();
    for response in [
        running("resp_of_a", "in_progress", Some("a")),
        running("resp_of_b", "queued", Some("b")),
        running("resp_of_nobody", "in_progress", None),
        running("resp_of_dead", "in_progress", Some("dead")),
        response("resp_done", None),
    ] {
        store.save_response(&response, &[]).await.unwrap();
    }
    let found = store.get_response("resp_of_a").await.unwrap().unwrap();
    assert_eq!(found.owner.as_deref(), Some("a"));

    let at_start = store
        .orphaned_responses("b", true, hour, 100)
        .await
        .unwrap();
    assert_eq!(
        sorted_ids(&at_start),
        ["resp_of_b", "resp_of_dead", "resp_of_nobody"]
    );
    let sweep = store
        .orphaned_responses("b", false, hour, 100)
        .await
        .unwrap();
    assert_eq!(sorted_ids(&sweep), ["resp_of_dead", "resp_of_nobody"]);
    let expired = store
        .orphaned_responses("b", false, std::time::Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(
        sorted_ids(&expired),
        ["resp_of_a", "resp_of_dead", "resp_of_nobody"]
    );
    assert_eq!(
        store
            .orphaned_responses("b", true, hour, 2)
            .await
            .unwrap()
            .len(),
        2
    );

    let ended = StoredResponse {
        status: "failed".into(),
        raw: json!({"id": "resp_of_b", "status": "failed", "error": {"code": "x"}}),
        owner: None,
        ..running("resp_of_b", "queued", None)
    };
    assert!(store.end_orphan(&ended, Some("b")).await.unwrap());
    assert_eq!(
        store.get_response("resp_of_b").await.unwrap(),
        Some(ended.clone())
    );
    // Ended already: not again.
    assert!(!store.end_orphan(&ended, Some("b")).await.unwrap());
    // Not under the owner it was found with: untouched.
    let not_yours = StoredResponse {
        id: "resp_of_a".into(),
        ..ended.clone()
    };
    assert!(!store.end_orphan(&not_yours, Some("b")).await.unwrap());
    assert_eq!(
        store
            .get_response("resp_of_a")
            .await
            .unwrap()
            .unwrap()
            .status,
        "in_progress"
    );
    // A row nobody owns is ended under `None`.
    let nobody = StoredResponse {
        id: "resp_of_nobody".into(),
        ..ended
    };
    assert!(store.end_orphan(&nobody, None).await.unwrap());
    assert_eq!(
        sorted_ids(
            &store
                .orphaned_responses("b", true, hour, 100)
                .await
                .unwrap()
        ),
        ["resp_of_dead"]
    );
}

/// A cancel asked of the store (by a gateway that does not run the
/// response) is recorded only on a row in flight, and its owner, and only
/// its owner, finds it; the gateway's own upserts of the row keep it, and
/// once the row has ended nothing is asked of anyone.
pub async fn a_cancel_is_recorded_only_on_a_response_in_flight_for_its_owner(
    store: &dyn HistoryStore,
) {
    for response in [
        running("resp_cancel_a", "queued", Some("a")),
        running("resp_other_a", "in_progress", Some("a")),
        running("resp_cancel_b", "in_progress", Some("b")),
        response("resp_cancel_done", None),
    ] {
        store.save_response(&response, &[]).await.unwrap();
    }
    assert!(store.cancel_requests("a").await.unwrap().is_empty());
    assert!(store.request_cancel("resp_cancel_a").await.unwrap());
    assert!(store.request_cancel("resp_cancel_b").await.unwrap());
    assert!(!store.request_cancel("resp_cancel_done").await.unwrap());
    assert!(!store.request_cancel("resp_cancel_unknown").await.unwrap());
    assert_eq!(store.cancel_requests("a").await.unwrap(), ["resp_cancel_a"]);
    assert_eq!(store.cancel_requests("b").await.unwrap(), ["resp_cancel_b"]);
    assert!(store.cancel_requests("c").await.unwrap().is_empty());
    // Its gateway stores it `in_progress` as it starts: still asked.
    store
        .save_response(&running("resp_cancel_a", "in_progress", Some("a")), &[])
        .await
        .unwrap();
    assert_eq!(store.cancel_requests("a").await.unwrap(), ["resp_cancel_a"]);
    // Ended (cancelled, its owner cleared): nothing more to ask.
    let ended = StoredResponse {
        status: "cancelled".into(),
        owner: None,
        ..running("resp_cancel_a", "cancelled", None)
    };
    store.save_response(&ended, &[]).await.unwrap();
    assert!(store.cancel_requests("a").await.unwrap().is_empty());
    assert!(!store.request_cancel("resp_cancel_a").await.unwrap());
    assert_eq!(
        store.get_response("resp_cancel_a").await.unwrap(),
        Some(ended),
        "the request changes nothing a reader sees"
    );
}

pub async fn write_a_sample(store: &dyn HistoryStore) {
    save_chain(store, "sample", 3).await;
    conversation_with_items(store, "conv_sample", 3).await;
}

/// Reads back what [`write_a_sample`] wrote, through another store.
pub async fn read_the_sample(store: &dyn HistoryStore) {
    assert_eq!(
        chain_ids(&store.response_chain("sample_3", 10).await.unwrap()),
        ["sample_1", "sample_2", "sample_3"]
    );
    assert_eq!(
        store.get_response("sample_2").await.unwrap(),
        Some(response("sample_2", Some("sample_1")))
    );
    assert_eq!(
        store.get_conversation("conv_sample").await.unwrap(),
        Some(conversation("conv_sample"))
    );
    let listed = store
        .list_items("conv_sample", &page(2, Order::Desc, None))
        .await
        .unwrap();
    assert_eq!(item_ids(&listed.items), ["conv_sample_3", "conv_sample_2"]);
    assert!(listed.has_more);
    // The order continues after the items already there.
    store
        .add_items("conv_sample", &[item("sample_more", "conv_sample")])
        .await
        .unwrap();
    let listed = store
        .list_items("conv_sample", &page(10, Order::Asc, Some("conv_sample_3")))
        .await
        .unwrap();
    assert_eq!(item_ids(&listed.items), ["sample_more"]);
}
