//! The official MCP conformance suite's fixture tools, each one a guarded tool.
//!
//! The suite (`@modelcontextprotocol/conformance`) calls tools of fixed names and checks what
//! they answer. This server offers the ones its `tools-call-simple-text`, `tools-call-error` and
//! `input-required-result-*` scenarios call, built only from the public guard API — the
//! [`LedgerGuard`], the [`Guarded`] extractor, [`status_router`] — exactly as
//! `examples/guarded_tool.rs` is, so the suite's multi-round checks exercise the guard:
//! every completed operation is one ledger row committed with one row of the application's
//! own `fixture_effects` table, and a continuation sent again replays instead of writing twice.
//!
//! **Where the operation id comes from.** The suite sends no arguments, so no client-chosen
//! idempotency key exists. The server mints one (`op-` and 32 random hex digits):
//! - single-round tools (`test_simple_text`, `test_error_handling`) take an optional
//!   `operation_id`; a call without one gets a fresh key, so it is recorded and queryable by
//!   the `operationId` of its reply, but a retry of it is a new operation — the honest reading
//!   of a call that names no operation;
//! - multi-round tools mint the key in round 1, when nothing is written yet, and return it as
//!   the visible prefix of their `requestState`: `<operation id>.<sealed token>`. The token is
//!   sealed with the key as associated data, so an altered prefix or token does not open
//!   (`request_state_invalid`). Every later round of that operation carries the same key, so
//!   however often a client repeats a round, the operation commits at most once, and the exact
//!   final continuation sent again replays its stored result.
//!
//! Answers are read only from a continuation whose `requestState` this server issued:
//! `inputResponses` without one are not bound to any question, so the call is a first round
//! again. An answer that is missing or malformed is asked for again (same operation); one
//! round's answers travel to the next inside the sealed token. An input request is only sent
//! for a capability the client declared (`test_input_required_result_capabilities` picks
//! among elicitation, sampling and roots; the others refuse with `continuation_unsupported`).
//!
//! `cargo run -p toolledger-mcp --example conformance_server -- [--http ADDR] [DATABASE]` serves
//! streamable HTTP at `http://ADDR/mcp` (default `127.0.0.1:0`) with bearer tokens; it adds
//! principal `conformance` and prints `{"listening": URL, "token": TOKEN}` on stderr. DATABASE
//! is a SQLite file or a `postgres://` URL (default: a temporary SQLite file).
//! tests/conformance_example.rs runs the suite against it in-process.

use std::collections::BTreeMap;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{schema_for_output, RequestState};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResponse, ClientCapabilities, InputRequest};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::engine::InlineEffect;
use toolledger::model::{Error, ErrorCode, Principal};
use toolledger::store::Migration;
use toolledger_mcp::front::{health_routes, HttpFront};
use toolledger_mcp::{status_router, Guarded, LedgerGuard, Receipt, Refusal};

/// The application's own table: one row per committed operation, with what it answered.
pub const FIXTURE_EFFECTS: Migration = Migration {
    namespace: "example.conformance",
    version: 1,
    sql: "CREATE TABLE fixture_effects (id BIGINT PRIMARY KEY, tool TEXT NOT NULL,
              author TEXT NOT NULL, answer TEXT NOT NULL)",
};

const INSERT_EFFECT: &str = "INSERT INTO fixture_effects(id, tool, author, answer) \
    SELECT coalesce(max(id), 0) + 1, ?1, ?2, ?3 FROM fixture_effects RETURNING id";

/// What `test_simple_text` answers (the suite's fixture text).
pub const SIMPLE_TEXT: &str = "This is a simple text response for testing.";

/// The principal every bearer token of `main` resolves to.
pub const PRINCIPAL: &str = "conformance";

/// A fresh server-minted operation id.
fn mint() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    format!("op-{}", hex::encode(bytes))
}

/// Arguments of a single-round fixture.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MaybeKeyed {
    /// Idempotency key: retry with the same one to replay. Without one the server mints a
    /// fresh key (returned as `operationId`), so the call is recorded but a retry repeats it.
    #[schemars(length(min = 1, max = 256))]
    operation_id: Option<String>,
}

/// A multi-round fixture takes no arguments: its operation id is minted in round 1.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArguments {}

/// What every fixture's effect returns (and a replay returns again).
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
pub struct Answered {
    /// The `fixture_effects` row written by the operation.
    #[serde(rename = "effectId")]
    effect_id: i64,
    /// The fixture's answer.
    result: String,
}

/// The effect: one `fixture_effects` row, inside the ledger's transaction.
struct Record {
    tool: String,
    answer: String,
}

impl InlineEffect for Record {
    fn apply(&self, tx: &mut dyn EffectTx, p: &Principal) -> Result<Value, Error> {
        let params = [
            self.tool.clone().into(),
            p.subject.clone().into(),
            self.answer.clone().into(),
        ];
        let id = tx
            .query_opt(INSERT_EFFECT, &params)?
            .unwrap_or_default()
            .int(0)?;
        Ok(json!({"effectId": id, "result": self.answer}))
    }
}

/// `test_error_handling`'s effect: writes its row, then fails, so the transaction (row and
/// ledger row alike) is rolled back and the refusal is answered in-band.
struct AlwaysFails;

impl InlineEffect for AlwaysFails {
    fn apply(&self, tx: &mut dyn EffectTx, p: &Principal) -> Result<Value, Error> {
        let params = [
            "test_error_handling".to_string().into(),
            p.subject.clone().into(),
            "never committed".to_string().into(),
        ];
        tx.query_opt(INSERT_EFFECT, &params)?;
        Err(Error::new(
            ErrorCode::BusinessStateChanged,
            "This tool intentionally returns an error for testing; its write was rolled back",
        ))
    }
}

/// One input request a multi-round fixture may send: its `inputRequests` key, the request
/// as the suite's scenario describes it, and how to read the client's answer.
struct Question {
    key: &'static str,
    method: &'static str,
    params: fn() -> Value,
    read: fn(&Value) -> Option<String>,
}

impl Question {
    fn request(&self) -> Result<InputRequest, Refusal> {
        serde_json::from_value(json!({"method": self.method, "params": (self.params)()}))
            .map_err(|_| Refusal(Error::unavailable("an input request could not be built")))
    }

    fn declared(&self, caps: &ClientCapabilities) -> bool {
        match self.method {
            "elicitation/create" => caps.elicitation.is_some(),
            "sampling/createMessage" => caps.sampling.is_some(),
            _ => caps.roots.is_some(),
        }
    }
}

/// A form elicitation asking for one property of JSON type `kind`.
fn form(message: &str, property: &str, kind: &str) -> Value {
    json!({
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {property: {"type": kind}},
            "required": [property],
        },
    })
}

/// An accepted elicitation's `content[field]` (a non-empty string or a boolean).
fn accepted(answer: &Value, field: &str) -> Option<String> {
    if answer["action"] != "accept" {
        return None;
    }
    match &answer["content"][field] {
        Value::String(s) if !s.is_empty() && s.chars().count() <= 200 => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A sampling result's text (content as one block or a list of blocks).
fn sampled(answer: &Value) -> Option<String> {
    let content = &answer["content"];
    let block = if content.is_array() {
        &content[0]
    } else {
        content
    };
    match &block["text"] {
        Value::String(s) if !s.is_empty() && s.chars().count() <= 1000 => Some(s.clone()),
        _ => None,
    }
}

/// A roots/list result's URIs.
fn roots(answer: &Value) -> Option<String> {
    let uris: Option<Vec<&str>> = answer["roots"]
        .as_array()?
        .iter()
        .map(|r| r["uri"].as_str())
        .collect();
    uris.filter(|u| !u.is_empty()).map(|u| u.join(" "))
}

const USER_NAME: Question = Question {
    key: "user_name",
    method: "elicitation/create",
    params: || form("What is your name?", "name", "string"),
    read: |a| accepted(a, "name"),
};
const CONFIRM: Question = Question {
    key: "confirm",
    method: "elicitation/create",
    params: || form("Please confirm", "ok", "boolean"),
    read: |a| accepted(a, "ok"),
};
const CAPITAL: Question = Question {
    key: "capital_question",
    method: "sampling/createMessage",
    params: || {
        json!({"messages": [{"role": "user", "content": {"type": "text",
            "text": "What is the capital of France?"}}], "maxTokens": 100})
    },
    read: sampled,
};
const GREETING: Question = Question {
    key: "greeting",
    method: "sampling/createMessage",
    params: || {
        json!({"messages": [{"role": "user", "content": {"type": "text",
            "text": "Generate a greeting"}}], "maxTokens": 50})
    },
    read: sampled,
};
const CLIENT_ROOTS: Question = Question {
    key: "client_roots",
    method: "roots/list",
    params: || json!({}),
    read: roots,
};
const STEP1: Question = Question {
    key: "step1",
    method: "elicitation/create",
    params: || form("Step 1: What is your name?", "name", "string"),
    read: |a| accepted(a, "name"),
};
const STEP2: Question = Question {
    key: "step2",
    method: "elicitation/create",
    params: || form("Step 2: What is your favorite color?", "color", "string"),
    read: |a| accepted(a, "color"),
};

type Answers = BTreeMap<String, String>;

/// A multi-round fixture: its rounds of questions and the answer its effect records.
struct Fixture {
    rounds: &'static [&'static [Question]],
    /// Ask only the first question of the round the client declared a capability for.
    adaptive: bool,
    finish: fn(&Answers) -> String,
}

/// Which round a `requestState` answers, what it asked, and what earlier rounds answered;
/// sealed inside the token as its step.
#[derive(Serialize, Deserialize)]
struct Step {
    round: usize,
    asked: Vec<String>,
    answers: Answers,
}

fn invalid_state() -> Refusal {
    Refusal(Error::new(
        ErrorCode::RequestStateInvalid,
        "the continuation state is invalid, expired or not yours",
    ))
}

/// Runs one round of a multi-round fixture for `g` (see the module docs).
async fn round(
    g: Guarded,
    state: Option<String>,
    ctx: RequestContext<RoleServer>,
    fixture: &Fixture,
) -> Result<CallToolResponse, Refusal> {
    let caps = ctx.client_capabilities().unwrap_or_default();
    let Some(state) = state else {
        let step = Step {
            round: 0,
            asked: Vec::new(),
            answers: Answers::new(),
        };
        return ask(&g, &mint(), step, fixture, &caps).await;
    };
    let (operation_id, token) = state.split_once('.').ok_or_else(invalid_state)?;
    let answered = g.resume(operation_id, token).await?;
    let given = g.answers().cloned().unwrap_or_default();
    let mut step: Step =
        serde_json::from_str(&answered.resumed.binding.step).map_err(|_| invalid_state())?;
    let questions = fixture.rounds.get(step.round).ok_or_else(invalid_state)?;
    let mut answers = step.answers.clone();
    for key in step.asked.clone() {
        let question = questions.iter().find(|q| q.key == key);
        let answer = question.and_then(|q| given.get(&key).and_then(q.read));
        let Some(answer) = answer else {
            // Missing or malformed: ask this round again, for the same operation.
            step.asked.clear();
            return ask(&g, operation_id, step, fixture, &caps).await;
        };
        answers.insert(key, answer);
    }
    if step.round + 1 < fixture.rounds.len() {
        let next = Step {
            round: step.round + 1,
            asked: Vec::new(),
            answers,
        };
        return ask(&g, operation_id, next, fixture, &caps).await;
    }
    let effect = Record {
        tool: g.tool().to_string(),
        answer: (fixture.finish)(&answers),
    };
    let intent = json!({"answers": answers});
    let Json(receipt) = g
        .run_rounds::<Answered>(operation_id, &answered, intent, effect)
        .await?;
    Ok(receipt.into_response())
}

/// Answers `input_required` for `step`'s round with a `requestState` of the operation
/// `operation_id`, asking only for what the client declared it can answer.
async fn ask(
    g: &Guarded,
    operation_id: &str,
    mut step: Step,
    fixture: &Fixture,
    caps: &ClientCapabilities,
) -> Result<CallToolResponse, Refusal> {
    let questions = fixture.rounds[step.round];
    let chosen: Vec<&Question> = if fixture.adaptive {
        questions
            .iter()
            .filter(|q| q.declared(caps))
            .take(1)
            .collect()
    } else if questions.iter().all(|q| q.declared(caps)) {
        questions.iter().collect()
    } else {
        Vec::new()
    };
    if chosen.is_empty() {
        return Err(Refusal(Error::new(
            ErrorCode::ContinuationUnsupported,
            "this tool asks for input the client did not declare it can give",
        )));
    }
    step.asked = chosen.iter().map(|q| q.key.to_string()).collect();
    let requests = chosen
        .iter()
        .map(|q| Ok((q.key.to_string(), q.request()?)))
        .collect::<Result<Vec<_>, Refusal>>()?;
    let step = serde_json::to_string(&step).map_err(|_| invalid_state())?;
    // The operation id is minted per first round, so no earlier operation can hold it; the
    // intent the rounds fix is the answers, all given by the input requests.
    match g.ask(operation_id, json!({}), &step, requests).await? {
        CallToolResponse::InputRequired(mut ir) => {
            ir.request_state = ir.request_state.map(|t| format!("{operation_id}.{t}"));
            Ok(CallToolResponse::InputRequired(ir))
        }
        other => Ok(other),
    }
}

const ELICITATION: Fixture = Fixture {
    rounds: &[&[USER_NAME]],
    adaptive: false,
    finish: |a| format!("Hello, {}!", a["user_name"]),
};
const SAMPLING: Fixture = Fixture {
    rounds: &[&[CAPITAL]],
    adaptive: false,
    finish: |a| a["capital_question"].clone(),
};
const LIST_ROOTS: Fixture = Fixture {
    rounds: &[&[CLIENT_ROOTS]],
    adaptive: false,
    finish: |a| format!("roots: {}", a["client_roots"]),
};
const REQUEST_STATE: Fixture = Fixture {
    rounds: &[&[CONFIRM]],
    adaptive: false,
    finish: |a| format!("state-ok: confirmed {}", a["confirm"]),
};
const MULTIPLE_INPUTS: Fixture = Fixture {
    rounds: &[&[USER_NAME, GREETING, CLIENT_ROOTS]],
    adaptive: false,
    finish: |a| {
        let (name, greeting) = (&a["user_name"], &a["greeting"]);
        format!("{greeting} {name}, roots: {}", a["client_roots"])
    },
};
const MULTI_ROUND: Fixture = Fixture {
    rounds: &[&[STEP1], &[STEP2]],
    adaptive: false,
    finish: |a| format!("{} likes {}", a["step1"], a["step2"]),
};
const TAMPERED_STATE: Fixture = Fixture {
    rounds: &[&[CONFIRM]],
    adaptive: false,
    finish: |a| format!("confirmed {}", a["confirm"]),
};
const CAPABILITIES: Fixture = Fixture {
    rounds: &[&[CONFIRM, CAPITAL, CLIENT_ROOTS]],
    adaptive: true,
    finish: |a| a.values().cloned().collect::<Vec<_>>().join(" "),
};

/// The fixture server: an ordinary rmcp tool router, wrapped once by the ledger.
#[derive(Clone)]
pub struct Fixtures {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Fixtures {
    /// Answers a fixed text; one guarded operation per operation id.
    #[tool(annotations(destructive_hint = false, idempotent_hint = true))]
    async fn test_simple_text(
        &self,
        g: Guarded,
        Parameters(p): Parameters<MaybeKeyed>,
    ) -> Result<Json<Receipt<Answered>>, Refusal> {
        let key = p.operation_id.unwrap_or_else(mint);
        let effect = Record {
            tool: g.tool().to_string(),
            answer: SIMPLE_TEXT.into(),
        };
        g.run(&key, json!({}), effect).await
    }

    /// Always fails: its effect's write is rolled back and the error is answered in-band.
    #[tool(annotations(destructive_hint = false, idempotent_hint = true))]
    async fn test_error_handling(
        &self,
        g: Guarded,
        Parameters(p): Parameters<MaybeKeyed>,
    ) -> Result<Json<Receipt<Answered>>, Refusal> {
        let key = p.operation_id.unwrap_or_else(mint);
        g.run(&key, json!({}), AlwaysFails).await
    }

    /// Asks for the caller's name (elicitation), then greets them.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_elicitation(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &ELICITATION).await
    }

    /// Asks the client's model a question (sampling), then records its answer.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_sampling(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &SAMPLING).await
    }

    /// Asks for the client's roots, then records them.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_list_roots(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &LIST_ROOTS).await
    }

    /// Asks for a confirmation; the result says `state-ok` once the state was verified.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_request_state(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &REQUEST_STATE).await
    }

    /// Asks for a name, a sampled greeting and the roots in one round.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_multiple_inputs(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &MULTIPLE_INPUTS).await
    }

    /// Asks for a name, then (with a new requestState) a colour, then records both.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_multi_round(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &MULTI_ROUND).await
    }

    /// Asks for a confirmation with an integrity-protected requestState.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_tampered_state(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &TAMPERED_STATE).await
    }

    /// Asks through whichever of elicitation, sampling or roots the client declared.
    #[tool(output_schema = schema_for_output::<Receipt<Answered>>())]
    async fn test_input_required_result_capabilities(
        &self,
        g: Guarded,
        RequestState(state): RequestState,
        ctx: RequestContext<RoleServer>,
        Parameters(_): Parameters<NoArguments>,
    ) -> Result<CallToolResponse, Refusal> {
        round(g, state, ctx, &CAPABILITIES).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Fixtures {}

/// Opens the ledger at `database` (a SQLite file or a `postgres://` URL) and builds the HTTP
/// application: `/mcp` (streamable HTTP, both lifecycles) inside the library's front (Host and
/// Origin, bearer tokens, the strict body, limits), and the health routes.
pub async fn open(
    database: &str,
) -> Result<(LedgerGuard, axum::Router), Box<dyn std::error::Error>> {
    let builder = LedgerGuard::builder().database(database);
    let ledger = builder
        .migrations(&[FIXTURE_EFFECTS])
        .bearer_tokens()
        .open()?;
    let tool_router = ledger.router(Fixtures::tool_router() + status_router())?;
    let server = Fixtures { tool_router };
    let principals = ledger.principals().clone();
    let app = HttpFront::default()
        .router(server, principals.clone())
        .merge(health_routes(principals.store().clone()));
    Ok((ledger, app))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut args = std::env::args().skip(1);
    let (mut addr, mut database) = ("127.0.0.1:0".to_string(), None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--http" => addr = args.next().ok_or("--http needs ADDR")?,
            _ => database = Some(arg),
        }
    }
    let temporary = dir.path().join("conformance.sqlite").display().to_string();
    let (ledger, app) = open(&database.unwrap_or(temporary)).await?;
    let token = ledger
        .principals()
        .add(PRINCIPAL, "conformance", &[], &[], true)
        .await?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    eprintln!("{}", json!({"listening": url, "token": token}));
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    HttpFront::default().serve(listener, app, shutdown).await?;
    Ok(())
}
