//! Maintenance mode in the route table: the ingresses routing to a deployment in maintenance
//! (`store::Maintenance`) answer every request with 503, a small HTML page showing the
//! operator's message and a `Retry-After` header, instead of proxying to the replicas, which
//! keep running untouched.
//!
//! Invariants:
//! - pure: the same table and rows give the same views and byte-identical JSON;
//! - the message is HTML-escaped, and `{`/`}` too, since Caddy expands `{placeholders}` in a
//!   static response's body; the page itself has no brace;
//! - an ingress is in maintenance exactly when the deployment it routes to (same scope, its
//!   `service`) has a row; every route of it answers the page, whatever its path.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::routes::RouteTable;
use crate::store::Maintenance;

/// What an ingress in maintenance serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Page {
    pub(crate) message: String,
    /// Seconds, the `Retry-After` header.
    pub(crate) retry_after: u64,
}

/// Marks every ingress of `table` whose deployment is in `rows` (keyed by scope and
/// deployment name).
pub(crate) fn apply(table: &mut RouteTable, rows: &[Maintenance]) {
    let pages: BTreeMap<(&str, &str), Page> = crate::model::map_of(rows.iter().map(|row| {
        (
            (row.scope.as_str(), row.name.as_str()),
            Page {
                message: row.message.clone(),
                retry_after: row.retry_after,
            },
        )
    }));
    for view in &mut table.ingresses {
        view.maintenance = pages
            .get(&(view.key.scope.as_str(), view.service.as_str()))
            .cloned();
    }
}

/// `text` safe inside HTML text and attributes, and inside a Caddy response body.
pub(crate) fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '{' => out.push_str("&#123;"),
            '}' => out.push_str("&#125;"),
            c => out.push(c),
        }
    }
    out
}

/// The maintenance page for `message`.
pub(crate) fn page(message: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>Down for maintenance</title>\n</head>\n\
         <body style=\"font-family: sans-serif; max-width: 40rem; margin: 4rem auto; padding: 0 1rem; color: #222\">\n\
         <h1>Down for maintenance</h1>\n<p>{}</p>\n</body>\n</html>\n",
        html_escape(message)
    )
}

/// The Caddy handler answering `page`.
pub(crate) fn handler(page_of: &Page) -> Value {
    json!({
        "handler": "static_response",
        "status_code": 503,
        "headers": {
            "Content-Type": ["text/html; charset=utf-8"],
            "Retry-After": [page_of.retry_after.to_string()],
            "Cache-Control": ["no-store"],
        },
        "body": page(&page_of.message),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::routes::{Backend, caddy_config, route_table};
    use super::*;
    use crate::manifest::spec::{DeploymentSpec, IngressSpec};
    use crate::model::{Kind, ResourceKey};

    fn row(scope: &str, name: &str, message: &str, retry_after: u64) -> Maintenance {
        Maintenance {
            scope: scope.to_owned(),
            name: name.to_owned(),
            message: message.to_owned(),
            retry_after,
            since: 0,
            origin: "cli".to_owned(),
            actor: None,
        }
    }

    /// The Caddy routes of the plain HTTP server for two ingresses (`shop/web`, `shop/api`,
    /// each to its deployment with one ready replica), with `rows` in maintenance.
    fn served(rows: &[Maintenance]) -> (RouteTable, Vec<Value>) {
        let web = DeploymentSpec {
            ports: vec!["8080".to_owned()],
            ..DeploymentSpec::default()
        };
        let ingresses = [
            (
                ResourceKey::new(Kind::Ingress, "shop", "web"),
                IngressSpec {
                    host: "web.test".to_owned(),
                    ..IngressSpec::default()
                },
            ),
            (
                ResourceKey::new(Kind::Ingress, "shop", "api"),
                IngressSpec {
                    host: "api.test".to_owned(),
                    ..IngressSpec::default()
                },
            ),
        ];
        let backends: BTreeMap<ResourceKey, Backend<'_>> = ["web", "api"]
            .into_iter()
            .map(|name| {
                (
                    ResourceKey::new(Kind::Deployment, "shop", name),
                    Backend {
                        spec: &web,
                        ready: vec![format!("10.0.0.{}", name.len())],
                        tasks: None,
                        preview: None,
                        canary: None,
                    },
                )
            })
            .collect();
        let mut table = route_table(&ingresses, &backends, None);
        apply(&mut table, rows);
        let config = caddy_config(&table, "origin.invalid");
        let routes = config["apps"]["http"]["servers"]["http"]["routes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (table, routes)
    }

    fn route_for<'a>(routes: &'a [Value], host: &str) -> &'a Value {
        routes
            .iter()
            .find(|route| route["match"][0]["host"][0] == host)
            .unwrap_or(&Value::Null)
    }

    #[test]
    fn a_deployment_in_maintenance_answers_503_with_the_page_and_others_are_unchanged() {
        let (plain_table, plain) = served(&[]);
        let (table, routes) = served(&[row("shop", "web", "Back at 5 <pm>", 120)]);
        let web = route_for(&routes, "web.test");
        assert_eq!(
            web["handle"],
            json!([{
                "handler": "static_response",
                "status_code": 503,
                "headers": {
                    "Content-Type": ["text/html; charset=utf-8"],
                    "Retry-After": ["120"],
                    "Cache-Control": ["no-store"],
                },
                "body": page("Back at 5 <pm>"),
            }])
        );
        assert!(
            page("Back at 5 <pm>").contains("<p>Back at 5 &lt;pm&gt;</p>"),
            "the message is shown, escaped"
        );
        assert_eq!(web["terminal"], true);
        // The other ingress, and the catch-all 404, are exactly what they were.
        assert_eq!(
            route_for(&routes, "api.test"),
            route_for(&plain, "api.test")
        );
        assert_eq!(
            route_for(&plain, "web.test")["handle"][0]["handler"],
            "reverse_proxy"
        );
        assert_eq!(routes.len(), plain.len());
        assert_eq!(routes.last(), plain.last());
        // The views tell them apart, so the ingress's fingerprint (its status) follows.
        let web_key = ResourceKey::new(Kind::Ingress, "shop", "web");
        assert!(
            table
                .view(&web_key)
                .is_some_and(|view| view.maintenance.is_some())
        );
        assert!(
            plain_table
                .view(&web_key)
                .is_some_and(|view| view.maintenance.is_none())
        );
        // A row of another scope, or of a deployment no ingress routes to, changes nothing.
        let (_, other) = served(&[row("blog", "web", "x", 1), row("shop", "db", "x", 1)]);
        assert_eq!(other, plain);
    }

    #[test]
    fn the_message_is_escaped_for_html_and_caddy_placeholders() {
        let body = page("<script>alert('x')</script> & {http.request.header.Cookie}");
        assert!(
            body.contains(
                "<p>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &#123;http.request.header.Cookie&#125;</p>"
            ),
            "{body}"
        );
        assert!(!body.contains('{') && !body.contains('}'), "{body}");
    }
}
