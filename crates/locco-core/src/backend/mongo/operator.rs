//! What an operator sees: the live leases under a key or a prefix, read with the one test of a
//! lock the operator verbs share.

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{ReadPreference, SelectionCriteria};
use mongodb::Collection;

use crate::backend::shared::io::Failure;
use crate::contract::value::holder_of;
use crate::contract::KeyInfo;

use super::pipelines::lock_where;
use super::Inner;

/// A string taken literally in a regular expression.
pub(super) fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\^$.|?*+()[]{}-/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Inner {
    /// The live leases among the documents `filter` matches (at most `limit`, in key order),
    /// with the time left by the server's clock: those [`lock_where`] accepts.
    pub(super) async fn look(
        &self,
        locks: &Collection<Document>,
        filter: Document,
        limit: u32,
    ) -> Result<Vec<KeyInfo>, Failure> {
        let pipeline = vec![
            doc! { "$match": lock_where(filter) },
            doc! { "$sort": { "key": 1 } },
            doc! { "$limit": i64::from(limit.max(1)) },
            doc! { "$project": {
                "_id": 0, "key": 1, "uniqueValue": 1,
                "left": { "$subtract": [ { "$toLong": "$expireAt" }, { "$toLong": "$$NOW" } ] },
            } },
        ];
        let mut cursor = locks
            .aggregate(pipeline)
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .await
            .map_err(|e| self.failure(e))?;
        let mut out = Vec::new();
        while cursor.advance().await.map_err(|e| self.failure(e))? {
            let d = cursor.deserialize_current().map_err(|e| self.failure(e))?;
            let left = match d.get("left") {
                Some(Bson::Int64(n)) => *n as f64,
                Some(Bson::Int32(n)) => f64::from(*n),
                Some(Bson::Double(n)) => *n,
                _ => 0.0,
            };
            out.push(KeyInfo {
                key: d.get_str("key").unwrap_or_default().to_owned(),
                held: true,
                ttl_left: Some(left.max(0.0)),
                fence: None,
                holder: d.get_str("uniqueValue").ok().and_then(holder_of),
            });
        }
        Ok(out)
    }
}
