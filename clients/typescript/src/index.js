// @toolledger/client: the agent side of toolledger.
export { Ledger } from './journal.js';
export { LedgerSession, LedgerError, ledgerError, META_OPERATION_ID, META_LEDGER, META_NEW_INTENT, STATUS_TOOL } from './session.js';
export { uuidv5, uuidv7, canonicalJson } from './ids.js';
