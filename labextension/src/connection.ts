/**
 * The frontend end of the `model_debugger` comm: follows one notebook's kernel.
 *
 * Protocol (see model_debugger/comm.py): `hello` -> `snapshot`; `event` pushes with a new
 * snapshot; `request` {id, command, args} -> `reply` {id, ok, result | error}.
 * Reconnects when the kernel changes or restarts; when the kernel has no comm target (the
 * extension is not loaded) the state is `missing`, and it says hello again after the next
 * execution, or adopts the comm the kernel opens itself on `%load_ext model_debugger`.
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { Snapshot } from './snapshot';

export const TARGET = 'model_debugger';

export type ConnectionState =
  | 'no-kernel'
  | 'connecting'
  | 'connected'
  | 'missing'
  | 'restarting';

interface IPending {
  resolve: (value: any) => void;
  reject: (reason: Error) => void;
  timer: number;
}

const REQUEST_TIMEOUT_MS = 120_000;
const RETRY_MIN_MS = 1000;

export class KernelConnection {
  constructor(readonly sessionContext: ISessionContext) {
    sessionContext.kernelChanged.connect(this._onKernelChanged, this);
    sessionContext.statusChanged.connect(this._onStatus, this);
    void sessionContext.ready.then(() => this._attach());
  }

  get state(): ConnectionState {
    return this._state;
  }

  get snapshot(): Snapshot | null {
    return this._snapshot;
  }

  /** Emitted with every new snapshot (hello answer or pushed event) and state change. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Send a command; resolves with the kernel's result, rejects with its error. */
  request<T = unknown>(command: string, args: Record<string, unknown> = {}): Promise<T> {
    const comm = this._comm;
    if (!comm || comm.isDisposed || this._state !== 'connected') {
      return Promise.reject(new Error('not connected to a model_debugger kernel'));
    }
    const id = `r${++this._counter}-${Date.now()}`;
    return new Promise<T>((resolve, reject) => {
      const timer = window.setTimeout(() => {
        this._pending.delete(id);
        reject(new Error(`no reply to ${command} within ${REQUEST_TIMEOUT_MS / 1000} s`));
      }, REQUEST_TIMEOUT_MS);
      this._pending.set(id, { resolve, reject, timer });
      comm.send({ type: 'request', id, command, args } as any);
    });
  }

  /** Say hello again (a fresh snapshot), opening a new comm when needed. */
  refresh(): void {
    this._attach();
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.sessionContext.kernelChanged.disconnect(this._onKernelChanged, this);
    this.sessionContext.statusChanged.disconnect(this._onStatus, this);
    this._closeComm();
    Signal.clearData(this);
  }

  private _onKernelChanged(): void {
    this._snapshot = null;
    this._closeComm();
    this._attach();
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting') {
      this._snapshot = null;
      this._closeComm();
      this._setState('restarting');
      return;
    }
    if (status === 'dead') {
      this._closeComm();
      this._setState('no-kernel');
      return;
    }
    if (status === 'idle' && this._state !== 'connected' && this._state !== 'connecting') {
      const now = Date.now();
      if (now - this._lastTry >= RETRY_MIN_MS) {
        this._attach();
      } else if (!this._retryTimer) {
        this._retryTimer = window.setTimeout(() => {
          this._retryTimer = 0;
          if (this._state !== 'connected') {
            this._attach();
          }
        }, RETRY_MIN_MS);
      }
    }
  }

  private _attach(): void {
    if (this._disposed) {
      return;
    }
    const kernel = this.sessionContext.session?.kernel;
    if (!kernel) {
      this._setState('no-kernel');
      return;
    }
    if (kernel !== this._kernel) {
      this._kernel = kernel;
      try {
        // the kernel opens a comm itself when `%load_ext model_debugger` registers the target
        kernel.registerCommTarget(TARGET, (comm, msg) => this._adopt(comm, msg));
      } catch (e) {
        // already registered on this kernel connection
      }
    }
    if (this._comm && !this._comm.isDisposed && this._state === 'connected') {
      this._comm.send({ type: 'hello' } as any);
      return;
    }
    this._lastTry = Date.now();
    this._closeComm();
    this._setState('connecting');
    let comm: Kernel.IComm;
    try {
      comm = kernel.createComm(TARGET);
    } catch (e) {
      this._setState('missing');
      return;
    }
    this._wire(comm);
    comm.open({ type: 'hello' } as any).done.catch(() => {
      if (this._comm === comm) {
        this._setState('missing');
      }
    });
  }

  private _adopt(comm: Kernel.IComm, msg: KernelMessage.ICommOpenMsg): void {
    this._closeComm();
    this._wire(comm);
    this._onData((msg.content.data || {}) as any);
  }

  private _wire(comm: Kernel.IComm): void {
    this._comm = comm;
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      if (this._comm === comm) {
        this._onData((msg.content.data || {}) as any);
      }
    };
    comm.onClose = () => {
      if (this._comm !== comm) {
        return;
      }
      this._comm = null;
      this._failPending('the kernel closed the model_debugger comm');
      // closed before any snapshot: the kernel has no such target (extension not loaded)
      this._setState(this._state === 'connecting' || this._state === 'connected' ? 'missing' : this._state);
    };
  }

  private _onData(data: any): void {
    const type = data?.type;
    if (type === 'snapshot' || type === 'event') {
      this._snapshot = data.snapshot as Snapshot;
      this._state = 'connected';
      this._changed.emit();
    } else if (type === 'reply') {
      const pending = this._pending.get(data.id);
      if (!pending) {
        return;
      }
      this._pending.delete(data.id);
      window.clearTimeout(pending.timer);
      if (data.ok) {
        pending.resolve(data.result);
      } else {
        pending.reject(new Error(String(data.error || 'the kernel refused')));
      }
    }
  }

  private _closeComm(): void {
    const comm = this._comm;
    this._comm = null;
    this._failPending('the connection to the kernel changed');
    if (comm && !comm.isDisposed) {
      try {
        comm.close();
      } catch (e) {
        // the kernel is gone already
      }
    }
  }

  private _failPending(reason: string): void {
    for (const [, pending] of this._pending) {
      window.clearTimeout(pending.timer);
      pending.reject(new Error(reason));
    }
    this._pending.clear();
  }

  private _setState(state: ConnectionState): void {
    if (state !== this._state) {
      this._state = state;
      this._changed.emit();
    }
  }

  private _comm: Kernel.IComm | null = null;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _state: ConnectionState = 'no-kernel';
  private _snapshot: Snapshot | null = null;
  private _pending = new Map<string, IPending>();
  private _counter = 0;
  private _lastTry = 0;
  private _retryTimer = 0;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}
