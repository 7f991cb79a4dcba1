//! The filters and update pipelines the verbs send: a lease's end by the server's clock, the
//! one test of a lock the operator verbs share, and the acquire pipeline over a key's queue.

use mongodb::bson::{doc, Bson, Document};

/// `$$NOW` plus `ttl` ms, with operators MongoDB 4.2 has (no `$add` on a date, no `$dateAdd`).
pub(super) fn now_plus(ttl: u32) -> Document {
    doc! { "$toDate": { "$add": [ { "$toLong": "$$NOW" }, i64::from(ttl) ] } }
}

/// The document is ours and its lease still runs.
pub(super) fn ours_live(key: &str, token: &str) -> Document {
    live(doc! { "key": key, "uniqueValue": token })
}

/// The documents `filter` matches whose lease still runs by the server's clock. The clock test
/// is an `$expr` beside the filter in an `$and`, not a field of it: MongoDB plans both the same,
/// but a planner that gives up on a filter with `$expr` in it (secantusd-rs does) would scan the
/// whole collection for every release and extension instead of using the key's index.
pub(super) fn live(filter: Document) -> Document {
    doc! { "$and": [ filter, { "$expr": { "$gt": [ "$expireAt", "$$NOW" ] } } ] }
}

/// The documents `filter` matches that are live leases this library wrote: a string `key`, a
/// string token in `uniqueValue`, a date in `expireAt` that the server's clock has not passed,
/// and no `queue` or an array of places. The one test of the operator verbs (`inspect`, `list`,
/// `forceRelease`), so that what they show is exactly what a forced release would delete, and
/// neither counts nor deletes anything else in the collection: a key only reserved for a
/// waiter, or a document the application put there.
///
/// The types are read by the aggregation `$type` in the `$expr`, not by a query's `$type`,
/// which also matches an array holding a value of that type (and a query on `key` matches an
/// array containing the key); and only a date compares with `$$NOW` as a lease end (a BSON
/// timestamp sorts after every date).
pub(super) fn lock_where(filter: Document) -> Document {
    let is = |field: &str, ty: &str| doc! { "$eq": [ { "$type": field }, ty ] };
    doc! { "$and": [ filter, { "$expr": { "$and": [
        is("$key", "string"),
        is("$uniqueValue", "string"),
        is("$expireAt", "date"),
        { "$in": [ { "$type": "$queue" }, [ "missing", "array" ] ] },
        { "$gt": [ "$expireAt", "$$NOW" ] },
    ] } } ] }
}

/// The document's places whose lease still runs, oldest first.
pub(super) fn live_places() -> Document {
    doc! { "$filter": {
        "input": { "$ifNull": [ "$queue", [] ] },
        "cond": { "$gt": [ "$$this.exp", "$$NOW" ] },
    } }
}

/// One field of every place in `array` (`$map`, since some servers answer `$a.b` on an empty
/// array with a missing value).
pub(super) fn place_field(array: &str, field: &str) -> Document {
    doc! { "$map": { "input": array, "in": format!("$$this.{field}") } }
}

/// The acquire pipeline (see [`Inner::attempt`]). Helper fields `_q` (the live places), `_f`
/// (the key is free), `_ok` (we take it) and `_in` (we have a place) are dropped at the end.
///
/// [`Inner::attempt`]: super::Inner::attempt
pub(super) fn attempt_pipeline(
    token: &str,
    ttl: u32,
    attempt: &str,
    waiter: Option<(&str, u32)>,
    adapter: &str,
) -> Vec<Document> {
    let free = doc! { "$or": [
        { "$eq": [ { "$ifNull": [ "$uniqueValue", Bson::Null ] }, Bson::Null ] },
        { "$eq": [ { "$type": "$expireAt" }, "missing" ] },
        { "$lte": [ "$expireAt", "$$NOW" ] },
    ] };
    let Some((me, lease)) = waiter else {
        // A try: one stage, which never writes the queue (the next queued write drops the
        // places that ran out), so that the uncontended grant costs what it did without one.
        let nobody_waits = doc! { "$cond": [
            { "$eq": [ { "$type": "$queue" }, "missing" ] },
            true,
            { "$eq": [ { "$size": live_places() }, 0 ] },
        ] };
        let ok = doc! { "$and": [ free.clone(), nobody_waits ] };
        return vec![doc! { "$set": {
            "uniqueValue": { "$cond": [ ok.clone(), token, "$uniqueValue" ] },
            "expireAt": { "$cond": [ ok.clone(), now_plus(ttl), "$expireAt" ] },
            "grant": { "$cond": [ ok, attempt, "$grant" ] },
        } }];
    };
    let nobody_ahead = doc! { "$or": [
        { "$eq": [ { "$size": "$_q" }, 0 ] },
        { "$eq": [ { "$arrayElemAt": [ place_field("$_q", "w"), 0 ] }, me ] },
    ] };
    let without_me = doc! { "$filter": { "input": "$_q", "cond": { "$ne": [ "$$this.w", me ] } } };
    let place_end = now_plus(lease);
    // Waiting on a free key reserves it: no holder, and the document lives as long as its
    // last place.
    let reserve = doc! { "$and": [ { "$not": [ "$_ok" ] }, "$_f" ] };
    let renewed = doc! { "$map": { "input": "$_q", "in": { "$cond": [
        { "$eq": [ "$$this.w", me ] },
        { "w": "$$this.w", "a": "$$this.a", "exp": place_end.clone() },
        "$$this",
    ] } } };
    let joined = doc! { "$concatArrays": [ "$_q", [ { "w": me, "a": adapter, "exp": place_end.clone() } ] ] };
    let set = doc! {
        "uniqueValue": { "$cond": [ "$_ok", token, { "$cond": [ reserve.clone(), "$$REMOVE", "$uniqueValue" ] } ] },
        "expireAt": { "$cond": [ "$_ok", now_plus(ttl), { "$cond": [ reserve,
            { "$max": [ place_end, { "$max": place_field("$_q", "exp") } ] },
            "$expireAt",
        ] } ] },
        "grant": { "$cond": [ "$_ok", attempt, "$grant" ] },
        "queue": { "$cond": [ "$_ok", without_me, { "$cond": [ "$_in", renewed, joined ] } ] },
        "at": "$$NOW",
    };
    vec![
        doc! { "$set": { "_q": live_places(), "_f": free } },
        doc! { "$set": {
            "_ok": { "$and": [ "$_f", nobody_ahead ] },
            "_in": { "$in": [ me, place_field("$_q", "w") ] },
        } },
        doc! { "$set": set },
        doc! { "$set": { "queue": { "$cond": [ { "$eq": [ { "$size": "$queue" }, 0 ] }, "$$REMOVE", "$queue" ] } } },
        doc! { "$unset": [ "_q", "_f", "_ok", "_in" ] },
    ]
}
